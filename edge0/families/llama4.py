"""Llama-4 (Scout, Maverick): top-k of the router logits, a sigmoid scales each expert's *input*.

The block is `feed_forward` (mlx-lm's MoE: `router` Linear without bias, `experts`
SwitchGLU, `shared_expert` MLP always added). The router picks the top-k logits (1 in
every release) and each expert runs on `x * sigmoid(logit)` (computed in fp32, cast back),
not `expert(x) * w`: `expert_input` scales, `combine` only sums. Sparse layers are
`moe_layers` (by default every `interleave_moe_layer_step`-th layer), the others a dense
MLP of `intermediate_size_mlp`. The text model nests under `text_config`; the vision tower is
dropped. HF experts are fused: `experts.gate_up_proj` (E, d, 2F), gate the first half of
the last axis, up the second, and `experts.down_proj` (E, F, d). Attention: RoPE layers
(`no_rope_layers`) with q/k norms, NoPE ones with temperature tuning; chunked attention on
the `layer_types` chunked_attention layers, global elsewhere (edge0.families.llama4_layers
rebuilds what mlx-lm's every-4th-layer rule gets wrong).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from edge0.families import llama4_layers
from edge0.families.audit import (
    EXPERTS,
    ROPE,
    SHAPE,
    TIED_OK,
    Fields,
    checked,
    computed,
    edge0,
)
from edge0.families.base import FULL, Family
from edge0.families.llama4_shapes import ROPE_SCOUT, flagship, tiny_config
from edge0.families.probes import YARN

_FUSED = re.compile(
    r"^.*layers\.(?P<layer>\d+)\.feed_forward\.experts\.(?P<kind>gate_up_proj|down_proj)$"
)
QK_EPS = 1e-6  # mlx-lm's llama4 q/k norm eps, whatever rms_norm_eps says
CHUNKED = llama4_layers.CHUNKED
PATTERN = "any pattern (edge0/families/llama4_layers.py; golden-tested irregular)"


class Llama4(Family):
    name = "llama4"
    model_types: ClassVar[dict[str, str]] = {"llama4": "llama4"}
    expert_keys = ("num_local_experts",)
    block_attr = "feed_forward"
    switch_attr = "experts"
    router_attr = "router"
    routing = "top-1 of logits, sigmoid of it scales the expert input"
    shared = "ungated, always added"
    text_type = "llama4_text"
    mlp_act = "activation_fn"  # transformers' Llama4TextMLP (the experts' is act_fn)

    fields: ClassVar[Fields] = {
        "num_local_experts": edge0(EXPERTS),
        "rope_parameters": ROPE,
        "attention_bias": computed("q/k/v/o biases (golden-tested)"),
        "head_dim": computed(SHAPE),
        "intermediate_size_mlp": computed(SHAPE + " (the dense layers' MLP)"),
        "attention_chunk_size": checked(
            lambda v, _: v is None or (isinstance(v, int) and v > 0),
            "null or a positive integer",
            "the chunked_attention layers' chunk (fixture: 4); null: every layer attends "
            "over the whole context, as transformers' layer_types then says",
        ),
        "attn_temperature_tuning": computed("NoPE layers' query temperature (fixture: on)"),
        "floor_scale": computed("the temperature's floor (fixture: 4)"),
        "attn_scale": computed("the temperature's slope (fixture: 0.1)"),
        "use_qk_norm": computed("q/k RMSNorm on the RoPE layers (eps from rms_norm_eps)"),
        "interleave_moe_layer_step": computed("every n-th layer is sparse, through moe_layers"),
        "moe_layers": checked(
            lambda v, c: v is None or _indices(v, c),
            "null or a list of layer indices",
            "the sparse layers, the others a dense MLP: " + PATTERN,
        ),
        "no_rope_layers": checked(
            lambda v, c: not v or _flags(v, c),
            "empty or an integer a layer",
            "1 on the layers that rotate q/k (and norm them), 0 on the NoPE ones (temperature "
            "tuning): " + PATTERN,
        ),
        "no_rope_layer_interval": computed("NoPE every n-th layer, through no_rope_layers"),
        "layer_types": checked(
            lambda v, c: v is None or _kinds(v, c),
            "one chunked_attention or full_attention a layer, chunked only with an "
            "attention_chunk_size",
            "chunked or global attention per layer (a chunked layer's cache keeps its chunk): "
            + PATTERN
            + "; transformers has no chunk mask without a chunk size",
        ),
        "tie_word_embeddings": computed(TIED_OK),
    }
    # its chunked-attention caches have no batch form that keeps each row's chunk
    stacks = False

    reference_class = "Llama4ForConditionalGeneration"  # the hub's releases: the multimodal model
    flagships: ClassVar[dict[str, Any]] = {
        "llama-4-scout-17b-16e": lambda: flagship(16, 1, True, ROPE_SCOUT),
        "llama-4-maverick-17b-128e": lambda: flagship(
            128, 2, False, {"rope_type": "default", "rope_theta": 500000.0}
        ),
        # Scout's tensors, 4 layers, MoE every 2nd: 4 GB on disk, a streamed run at Scout's
        # width (67.5 MiB records) on this machine
        "llama-4-scout-4layers": lambda: flagship(16, 2, True, ROPE_SCOUT, layers=4),
    }
    probes: ClassVar[dict[str, dict[str, Any]]] = {
        "no_temperature": {"text_config.attn_temperature_tuning": False},
        "no_qk_norm": {"text_config.use_qk_norm": False},
        "attention_bias": {"text_config.attention_bias": True},
        "tied": {"text_config.tie_word_embeddings": True},
        "moe_layers": {"text_config.moe_layers": [0, 3, 7]},  # 7: past the last layer
        "no_rope_layers": {
            "text_config.no_rope_layers": [0, 1, 1, 0],
            "text_config.layer_types": None,
        },
        "layer_types": {"text_config.layer_types": [CHUNKED, FULL, FULL, CHUNKED]},
        "no_chunks": {"text_config.attention_chunk_size": None, "text_config.layer_types": None},
        "top_k": {"text_config.num_experts_per_tok": 2},
        "chunked_no_size": {
            "text_config.attention_chunk_size": None,
            "text_config.layer_types": [CHUNKED, CHUNKED, CHUNKED, FULL],
        },
        "layers_3": {
            "text_config.num_hidden_layers": 3,
            "text_config.moe_layers": None,
            "text_config.no_rope_layers": None,
            "text_config.layer_types": None,
        },
    }
    variants: ClassVar[dict[str, dict[str, Any]]] = {
        "variant": {
            "text_config.attention_bias": True,
            "text_config.attn_temperature_tuning": False,
            "text_config.rope_parameters": dict(YARN),
            "text_config.tie_word_embeddings": True,
        },
        "top2": {"text_config.num_experts_per_tok": 2},
        # NoPE first, MoE on 0 and 2, global attention on a RoPE layer, 3 layers
        "layers": {
            "text_config.num_hidden_layers": 3,
            "text_config.moe_layers": [0, 2],
            "text_config.no_rope_layers": [0, 1, 1],
            "text_config.layer_types": [FULL, FULL, CHUNKED],
        },
        # weights of its own: a dense MLP's `activation_fn`, the shared expert's, the experts'
        "xielu": {"text_config.hidden_act": "xielu"},
    }

    # -- config ---------------------------------------------------------------------------
    def tiny(self, vocab: int) -> Any:
        return tiny_config(vocab)

    def normalize(self, tc: dict[str, Any]) -> dict[str, Any]:
        n = int(tc["num_hidden_layers"])
        step = int(tc.get("interleave_moe_layer_step") or 1)
        tc["interleave_moe_layer_step"] = step
        # transformers' defaults (Llama4TextConfig.__post_init__) where the file has none
        if tc.get("moe_layers") is None:
            tc["moe_layers"] = list(range(step - 1, n, step))
        if not tc.get("no_rope_layers"):
            every = int(tc.get("no_rope_layer_interval") or 4)
            tc["no_rope_layers"] = [int((i + 1) % every != 0) for i in range(n)]
        if tc.get("layer_types") is None:
            chunk = tc.get("attention_chunk_size") is not None
            tc["layer_types"] = [
                CHUNKED if rope and chunk else FULL for rope in tc["no_rope_layers"]
            ]
        tc.setdefault("attention_bias", False)
        tc.setdefault("rope_scaling", None)  # mlx-lm requires the key (Maverick: no scaling)
        tc.setdefault("use_qk_norm", True)
        return tc

    def mlx_config(self, tc: dict[str, Any]) -> dict[str, Any]:
        """mlx-lm's llama4 needs a chunk size (without one no layer is chunked: `adapt`) and
        builds top-1 blocks only (`adapt` sets the config's top-k)."""
        out = {**super().mlx_config(tc), "num_experts_per_tok": 1}
        if out.get("attention_chunk_size") is None:
            out["attention_chunk_size"] = int(tc["max_position_embeddings"])
        return out

    def adapt(self, model: nn.Module, tc: dict[str, Any]) -> None:
        """Each layer's rope, experts and attention chunks as transformers' config says
        (edge0.families.llama4_layers); mlx-lm normalises q and k with eps 1e-6,
        transformers with `rms_norm_eps`."""
        n, moe = int(tc["num_hidden_layers"]), set(self.sparse_layers(tc))
        llama4_layers.layer_pattern(
            model,
            rope=[bool(v) for v in tc["no_rope_layers"][:n]],
            moe=[i in moe for i in range(n)],
            chunked=[k == CHUNKED for k in tc["layer_types"]],
        )
        k = int(tc.get("num_experts_per_tok", 1))
        if k != 1:
            for i in sorted(moe):
                self.set_top_k(model.layers[i].feed_forward, k)
        eps = float(tc.get("rms_norm_eps", QK_EPS))
        if eps == QK_EPS:
            return
        for layer in model.layers:
            attn = layer.self_attn
            if getattr(attn, "use_qk_norm", False):
                attn.__class__ = llama4_layers.qk_norm_class()
                object.__setattr__(attn, "qk_eps", eps)

    def windows(self, tc: dict[str, Any]) -> list[int | None]:
        """The RoPE layers attend within chunks: their cache keeps one chunk (mlx-lm's
        ChunkedKVCache)."""
        chunk = tc.get("attention_chunk_size")
        return [chunk if k == "chunked_attention" else None for k in self.layer_kinds(tc)]

    def sparse_layers(self, tc: dict[str, Any]) -> list[int]:
        n, moe = int(tc["num_hidden_layers"]), tc.get("moe_layers")
        if moe is None:
            step = int(tc.get("interleave_moe_layer_step") or 1)
            moe = range(step - 1, n, step)
        return sorted({i for i in moe if 0 <= i < n})

    # -- checkpoint tensors --------------------------------------------------------------
    def fused_expert(self, name: str) -> tuple[int, str] | None:
        m = _FUSED.match(name)
        return None if m is None else (int(m["layer"]), m["kind"])

    def read_fused(self, read: Any, keys: set[str], expert: int) -> dict[str, Any]:
        gate_up, dtype = read("gate_up_proj", expert)  # (d, 2F): gate columns, then up
        down, down_dtype = read("down_proj", expert)  # (F, d)
        half = gate_up.shape[1] // 2
        return {
            "gate_proj": (np.ascontiguousarray(gate_up[:, :half].T), dtype),
            "up_proj": (np.ascontiguousarray(gate_up[:, half:].T), dtype),
            "down_proj": (np.ascontiguousarray(down.T), down_dtype),
        }

    # -- routing -------------------------------------------------------------------------
    def scores(self, block: nn.Module, x: mx.array) -> mx.array:
        return self.router_logits(block, x)

    def select(self, block: nn.Module, scores: mx.array, k: int) -> tuple[mx.array, mx.array]:
        inds = mx.argpartition(-scores, kth=k - 1, axis=-1)[..., :k]  # mlx-lm's order
        return inds, self.weights(block, scores, inds)

    def weights(self, block: nn.Module, scores: mx.array, inds: mx.array) -> mx.array:
        w = mx.take_along_axis(scores, inds, axis=-1)
        return mx.sigmoid(w.astype(mx.float32)).astype(scores.dtype)

    def expert_input(self, x: mx.array, w: mx.array) -> mx.array:
        """x * w for one expert; for k, each expert its own (..., k, d), as transformers."""
        return x * w if w.shape[-1] == 1 else mx.expand_dims(x, -2) * w[..., None]

    def combine(self, y: mx.array, w: mx.array) -> mx.array:
        return y.sum(axis=-2)  # the gate weight already scaled the input

    def extra(self, block: nn.Module, x: mx.array, y: mx.array) -> mx.array:
        return y + block.shared_expert(x)

    def set_top_k(self, block: nn.Module, k: int) -> None:
        """The resident block routes `k` experts, each on the input scaled by its own gate
        (mlx-lm's block scales one input: top-1 only)."""
        block.top_k = k
        if k != 1:
            block.__class__ = llama4_layers.top_k_class()


def _indices(value: Any, _: dict[str, Any]) -> bool:
    """A list of layer indices (transformers ignores those past the last layer)."""
    return isinstance(value, list) and all(_integer(i) for i in value)


def _flags(value: Any, config: dict[str, Any]) -> bool:
    """An integer a layer, 0 for NoPE (transformers reads the first num_hidden_layers)."""
    n = config.get("num_hidden_layers")
    return (
        isinstance(value, list)
        and isinstance(n, int)
        and len(value) >= n
        and all(_integer(v) for v in value)
    )


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kinds(value: Any, config: dict[str, Any]) -> bool:
    """One chunked or full attention a layer, chunked only with a chunk size."""
    kinds = {FULL} if config.get("attention_chunk_size") is None else {FULL, CHUNKED}
    return (
        isinstance(value, list)
        and len(value) == config.get("num_hidden_layers")
        and set(value) <= kinds
    )
