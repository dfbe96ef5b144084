"""The family contract: everything one MoE model family adds to the family-agnostic engine.

A family module holds one `Family` subclass: how its config marks experts and sparse
layers, its audit rows (what Edge0 does with each config field), its router's arithmetic
reproduced op for op from its mlx-lm sparse block (so a streamed layer computes
bit-identical outputs to the resident one when it runs the same experts), its expert
tensor names, what its per-layer caches hold (the memory plan), whether its rows stack
in a batch, and its test fixture and flagship shapes. `weights` gives the gate weights
of a *given* expert set (route mode runs the set the prerouter predicted): the family's
own rule applied to the true router scores of that set. Subclasses override what
differs; the defaults are the plain "softmax over all experts, then top-k" block with
one tensor per expert.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, ClassVar

import mlx.core as mx
import mlx.nn as nn

from edge0.families.audit import Fields
from edge0.model import rope

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
# transformers' layer_types values
FULL, LINEAR, SLIDING = "full_attention", "linear_attention", "sliding_attention"
# fixture data a family module declares for its own model_type (read from the class itself,
# never inherited: a subclass is another model_type with fixtures of its own)
FIXTURE_DATA = ("flagships", "probes", "variants", "refusals", "forms")
# a checkpoint written in another form: (weights, config, safetensors metadata "format")
Written = tuple[dict[str, mx.array], dict[str, Any], str]
# a derived checkpoint form: (weights, normalised config) -> the checkpoint in that form
Form = Callable[[dict[str, mx.array], dict[str, Any]], Written]


class Family:
    """One MoE architecture family (subclass per file in this package)."""

    name: ClassVar[str] = ""
    # config.json model_type -> mlx-lm module that runs it
    model_types: ClassVar[dict[str, str]] = {}
    # config keys holding the number of routed experts (the first int one wins)
    expert_keys: ClassVar[tuple[str, ...]] = ("num_experts",)
    # attribute of a decoder layer holding the sparse block
    block_attr: ClassVar[str] = "mlp"
    # attributes of the sparse block holding the routed experts (a SwitchGLU) and the
    # router's linear (a dotted path where the router wraps it: granitemoe `router.layer`)
    switch_attr: ClassVar[str] = "switch_mlp"
    router_attr: ClassVar[str] = "gate"
    # HF per-expert projection names -> edge0's (gate_proj, up_proj, down_proj)
    hf_projections: ClassVar[dict[str, str]] = {p: p for p in PROJECTIONS}
    routing: ClassVar[str] = "softmax, top-k"
    shared: ClassVar[str] = "none"

    # -- config as transformers reads it, and the audit (edge0.model.fields) ---------------
    # model_type -> the transformers config class it is read with, where not its own
    config_types: ClassVar[dict[str, str]] = {}
    # the text model's model_type inside a multimodal wrapper's text_config (None: no wrapper)
    text_type: ClassVar[str | None] = None
    # what Edge0 does with each of the family's own config fields (beside edge0.families.common)
    fields: ClassVar[Fields] = {}
    # mlx-lm's class reads a scaled rope from `rope_scaling` (normalize_config fills it in)
    rope_scaling_key: ClassVar[bool] = True
    # the gated MLPs and experts take `hidden_act` (edge0.model.activations)
    hidden_act: ClassVar[bool] = True
    # a dense gated MLP's activation module in the checkpoint (prelu's and xielu's weights)
    mlp_act: ClassVar[str] = "act_fn"
    # mlx-lm's attention reads `rope_scaling` beyond its rope (DeepSeek: YaRN's softmax scale)
    rope_in_attention: ClassVar[bool] = False

    # -- batched decode ------------------------------------------------------------------
    # the family's attention takes a batch cache's per-row offsets and left-padding mask
    # (every family fixture decodes batched exactly as alone: tests/test_batch_families.py)
    stacks: ClassVar[bool] = True

    # -- fixtures and shapes (edge0.synth; see FIXTURE_DATA) -------------------------------
    # the tiny config is committed as tests/fixtures/families/<name>.json (False: the
    # family's fixture is a checkpoint of its own under tests/fixtures/<name>/)
    family_fixture: ClassVar[bool] = True
    # the transformers class that computes the reference logits of a checkpoint
    reference_class: ClassVar[str] = "AutoModelForCausalLM"
    # RMSNorms multiply by (1 + w): random norm weights are zero-centred
    centred_norms: ClassVar[bool] = False
    # the released checkpoints' layout: a multimodal wrapper's `model.language_model.` prefix,
    # fused experts (gate_up_proj (E, 2F, D), down_proj (E, D, F)), conv1d (C, 1, K)
    hub_fused: ClassVar[bool] = False
    # flagship name -> its config (a transformers config, or config.json's dict)
    flagships: ClassVar[dict[str, Callable[[], Any]]] = {}
    # the experts' quantization of the flagships' released checkpoints
    expert_mode: ClassVar[str] = "affine"
    # config audit probes: name suffix -> config changes (beside the rope probes)
    probes: ClassVar[dict[str, dict[str, Any]]] = {}
    # computed non-default values: suffix -> config changes, each committed as the fixture
    # `<name>-<suffix>` with golden logits and run in every mode (tests/test_fidelity.py)
    variants: ClassVar[dict[str, dict[str, Any]]] = {}
    # refused values: (config changes, the start of the one-line refusal)
    refusals: ClassVar[list[tuple[dict[str, Any], str]]] = []
    # derived checkpoint forms with golden logits of their own: fixture name -> Form, made
    # from the family fixture's files (edge0.synth.forms)
    forms: ClassVar[dict[str, Form]] = {}

    def tiny(self, vocab: int) -> Any:
        """The tiny random checkpoint's transformers config with `vocab` tokens (tests/fixtures/
        families/; None: the family has no tiny fixture of its own)."""
        return None

    def mlx_lm_form(self, weights: dict[str, mx.array], config: dict[str, Any]) -> Written | None:
        """The checkpoint in the form mlx-lm's own loader reads, where its `sanitize` cannot
        read transformers' layout (None: it can)."""
        return None

    def shape_config(self, shape: Any, vocab: int, **extra: Any) -> dict[str, Any]:
        """config.json of a synthetic `shape` (edge0.synth.shapes.Shape: its dimensions)
        with `vocab` tokens, `extra` fields added; families that build none raise."""
        raise NotImplementedError(f"{self.name} builds no synthetic shapes")

    def own(self, attr: str) -> Any:
        """Fixture data declared by this class itself (FIXTURE_DATA), not by a parent."""
        return getattr(type(self) if attr in vars(type(self)) else Family, attr)

    # -- config ---------------------------------------------------------------------------
    def n_experts(self, tc: dict[str, Any]) -> int:
        """Routed experts per sparse layer from the text config (0: a dense model)."""
        for key in self.expert_keys:
            if isinstance(tc.get(key), int):
                return int(tc[key])
        return 0

    def normalize(self, tc: dict[str, Any]) -> dict[str, Any]:
        """Fill the fields the mlx-lm module needs from a transformers-5 config (in place)."""
        return tc

    def sparse_layers(self, tc: dict[str, Any]) -> list[int]:
        """Indices of the decoder layers whose MLP is a routed-expert block."""
        return list(range(int(tc["num_hidden_layers"])))

    # -- checkpoint tensors --------------------------------------------------------------
    def per_expert_pattern(self) -> re.Pattern[str]:
        """Matches one HF per-expert tensor: groups `layer`, `e`, `proj`."""
        projs = "|".join(map(re.escape, self.hf_projections))
        return re.compile(
            rf"^(?P<pre>.*layers\.(?P<layer>\d+)\.{re.escape(self.block_attr)})\.experts\."
            rf"(?P<e>\d+)\.(?P<proj>{projs})\.weight$"
        )

    def fused_expert(self, name: str) -> tuple[int, str] | None:
        """(layer, key) when `name` is one of the family's own fused expert tensors."""
        return None

    def read_fused(self, read: Any, keys: set[str], expert: int) -> dict[str, Any]:
        """One expert from the family's fused tensors: `read(key, e)` -> (raw, dtype).

        Returns {"gate_proj": (raw, dtype), ..., "gate_proj.bias": ...} (float), or the
        packed fields {"gate_proj.weight": ..., "gate_proj.scales": ...} when `hf_quantization`
        says the source's experts are packed.
        """
        raise NotImplementedError(f"{self.name} has no fused expert layout of its own")

    def hf_quantization(self, hf_quant: dict[str, Any]) -> dict[str, Any] | None:
        """The MLX quantization of an HF `quantization_config` whose experts are read packed."""
        return None

    def mlx_config(self, tc: dict[str, Any]) -> dict[str, Any]:
        """The (text) config mlx-lm's class is built from: a scaled rope said as a plain one
        (edge0.model.rope installs transformers' after the build), unless the attention
        itself reads it; families add what mlx-lm's class needs to build what `adapt` fixes."""
        return tc if self.rope_in_attention else rope.plain(tc)

    def ties(self, config: dict[str, Any]) -> bool:
        """Whether the output head is the embedding (transformers reads the text config's
        `tie_word_embeddings`; a wrapper family may read its own)."""
        text = config.get("text_config")
        return bool((text if isinstance(text, dict) else config).get("tie_word_embeddings"))

    def interleaved_rope(self, tc: dict[str, Any]) -> bool | None:
        """Whether the rope rotates interleaved pairs (None: as mlx-lm's class does)."""
        return None

    def adapt(self, model: nn.Module, tc: dict[str, Any]) -> None:
        """Fix the built mlx-lm model where it computes other than transformers (in place);
        a scaled rope is installed after (edge0.model.rope.install)."""

    def prepare_hf(self, weights: dict[str, mx.array], tc: dict[str, Any]) -> dict[str, mx.array]:
        """HF tensors -> what the mlx-lm module's `sanitize` expects (default: as they are)."""
        return weights

    def sanitize_resident(
        self, model: nn.Module, weights: dict[str, mx.array], tc: dict[str, Any], mlx: bool
    ) -> dict[str, mx.array]:
        """The model's `sanitize` on the resident tensors alone (convert leaves experts out).

        `mlx`: the source is an mlx-lm directory (experts stacked, names already sanitized).
        """
        return model.sanitize(weights) if hasattr(model, "sanitize") else weights

    # -- routing -------------------------------------------------------------------------
    def router(self, block: nn.Module) -> nn.Module:
        """The router's linear (E outputs) inside a sparse block."""
        return router_at(block, self.router_attr)

    def router_logits(self, block: nn.Module, x: mx.array) -> mx.array:
        """Raw router logits (..., E) (what the prerouter's linear path is initialised from)."""
        out: mx.array = self.router(block)(x)
        return out

    def scores(self, block: nn.Module, x: mx.array) -> mx.array:
        """Router scores (..., E) of `x` (probabilities, logits or sigmoids per family)."""
        return mx.softmax(self.router_logits(block, x), axis=-1, precise=True)

    def select(self, block: nn.Module, scores: mx.array, k: int) -> tuple[mx.array, mx.array]:
        """The true top-k: (inds (..., k), gate weights (..., k))."""
        inds = mx.argpartition(-scores, kth=k - 1, axis=-1)[..., :k]
        return inds, self.weights(block, scores, inds)

    def weights(self, block: nn.Module, scores: mx.array, inds: mx.array) -> mx.array:
        """Gate weights (..., k) of the expert set `inds` under this family's rule."""
        w = mx.take_along_axis(scores, inds, axis=-1)
        if getattr(block, "norm_topk_prob", False):
            w = w / mx.sum(w, axis=-1, keepdims=True)
        return w

    def expert_input(self, x: mx.array, w: mx.array) -> mx.array:
        """What the routed experts run on, given gate weights `w` (..., k): `x` (..., d) for
        all k, or (..., k, d), an input per expert (Llama-4: x * w)."""
        return x

    def combine(self, y: mx.array, w: mx.array) -> mx.array:
        """Routed outputs y (..., k, d) -> (..., d): gate-weighted sum (Llama-4: a plain sum)."""
        return (y * w[..., None]).sum(axis=-2)

    def extra(self, block: nn.Module, x: mx.array, y: mx.array) -> mx.array:
        """Add what the block adds besides routed experts (shared expert, casts)."""
        return y

    # -- memory (the plan counts what each layer's cache holds) ---------------------------
    def layer_kinds(self, tc: dict[str, Any]) -> list[str]:
        """Each decoder layer's attention (transformers' `layer_types` values)."""
        types = tc.get("layer_types")
        if isinstance(types, list):
            return [str(t) for t in types]
        return [FULL] * int(tc["num_hidden_layers"])

    def windows(self, tc: dict[str, Any]) -> list[int | None]:
        """Each layer's sliding window: the most tokens its KV cache holds (None: the whole
        context); by default transformers' `layer_types` (sliding_attention: sliding_window)."""
        window = tc.get("sliding_window")
        return [window if k == SLIDING else None for k in self.layer_kinds(tc)]

    def kv_token_bytes(self, tc: dict[str, Any], itemsize: int) -> int:
        """Keys and values one token adds to a full-attention layer's cache."""
        heads = int(tc.get("num_key_value_heads") or tc.get("num_attention_heads") or 1)
        head_dim = tc.get("head_dim") or int(tc["hidden_size"]) // int(tc["num_attention_heads"])
        return 2 * heads * int(head_dim) * itemsize

    def state_layer_bytes(self, tc: dict[str, Any], itemsize: int) -> int:
        """The recurrent state of one linear-attention layer (0: the family has none)."""
        return 0

    # -- capacity ------------------------------------------------------------------------
    def check_top_k(self, k: int) -> None:
        """Refuse (ConfigError) a `--top-k` this family's block cannot compute."""

    def top_k(self, block: nn.Module) -> int:
        """The block's own top-k."""
        for attr in ("top_k", "num_experts_per_tok"):
            k = getattr(block, attr, None)
            if isinstance(k, int):
                return k
        raise ValueError(f"sparse block {type(block).__name__} has no top_k attribute")

    def set_top_k(self, block: nn.Module, k: int) -> None:
        """Make the resident block route to `k` experts (`--top-k` in resident mode)."""
        for owner in (block, getattr(block, "gate", None)):
            for attr in ("top_k", "num_experts_per_tok"):
                if owner is not None and isinstance(getattr(owner, attr, None), int):
                    setattr(owner, attr, k)


def router_at(block: nn.Module, path: str) -> nn.Module:
    """The module at dotted `path` inside `block` (KeyError when a step is missing)."""
    module = block
    for step in path.split("."):
        if step not in module:
            raise KeyError(path)
        module = module[step]
    return module
