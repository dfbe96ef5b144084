"""Llama-4 (Scout, Maverick): top-1 of the router logits, its sigmoid scales the expert's *input*.

The block is `feed_forward` (mlx-lm's MoE: `router` Linear without bias, `experts`
SwitchGLU, `shared_expert` MLP always added). The router picks the top-1 logit and the
expert runs on `x * sigmoid(logit)` (computed in fp32, cast back), not `expert(x) * w`:
`expert_input` scales, `combine` only sums. Sparse layers are `moe_layers` (transformers)
= every `interleave_moe_layer_step`-th layer (mlx-lm's rule), the others a dense MLP of
`intermediate_size_mlp`. The text model nests under `text_config`; the vision tower is
dropped. HF experts are fused: `experts.gate_up_proj` (E, d, 2F), gate the first half of
the last axis, up the second, and `experts.down_proj` (E, F, d). Attention (mlx-lm's
model): RoPE and chunked attention on three layers of four, NoPE with global attention
and temperature tuning on every fourth.
"""

from __future__ import annotations

import functools
import re
from typing import Any, ClassVar

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from edge0.errors import ConfigError, ModelLoadError
from edge0.families.audit import EXPERTS, ROPE, SHAPE, TIED_OK, Fields, computed, edge0
from edge0.families.base import Family
from edge0.families.llama4_shapes import ROPE_SCOUT, flagship, tiny_config
from edge0.families.probes import YARN

_FUSED = re.compile(
    r"^.*layers\.(?P<layer>\d+)\.feed_forward\.experts\.(?P<kind>gate_up_proj|down_proj)$"
)
NOPE_INTERVAL = 4  # mlx-lm's llama4 hard-codes NoPE + global attention on every 4th layer
QK_EPS = 1e-6  # mlx-lm's llama4 q/k norm eps, whatever rms_norm_eps says

LAYOUT = "mlx-lm's llama4 hard-codes the pattern: checked by the family (one line)"


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

    fields: ClassVar[Fields] = {
        "num_local_experts": edge0(EXPERTS),
        "rope_parameters": ROPE,
        "attention_bias": computed("q/k/v/o biases (golden-tested)"),
        "head_dim": computed(SHAPE),
        "intermediate_size_mlp": computed(SHAPE + " (the dense layers' MLP)"),
        "attention_chunk_size": computed("chunked attention of the RoPE layers (fixture: 4)"),
        "attn_temperature_tuning": computed("NoPE layers' query temperature (fixture: on)"),
        "floor_scale": computed("the temperature's floor (fixture: 4)"),
        "attn_scale": computed("the temperature's slope (fixture: 0.1)"),
        "use_qk_norm": computed("q/k RMSNorm on the RoPE layers (eps from rms_norm_eps)"),
        "interleave_moe_layer_step": edge0("every n-th layer is sparse (fixture: 2)"),
        "moe_layers": edge0(LAYOUT),
        "no_rope_layers": edge0(LAYOUT),
        "no_rope_layer_interval": edge0(LAYOUT + " (through no_rope_layers)"),
        "layer_types": edge0(LAYOUT),
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
        # Scout's tensors, 4 layers (the fewest mlx-lm's llama4 runs), MoE every 2nd: 4 GB on
        # disk, a streamed run at Scout's width (67.5 MiB records) on this machine
        "llama-4-scout-4layers": lambda: flagship(16, 2, True, ROPE_SCOUT, layers=4),
    }
    probes: ClassVar[dict[str, dict[str, Any]]] = {
        "no_temperature": {"text_config.attn_temperature_tuning": False},
        "no_qk_norm": {"text_config.use_qk_norm": False},
        "attention_bias": {"text_config.attention_bias": True},
        "tied": {"text_config.tie_word_embeddings": True},
    }
    variants: ClassVar[dict[str, dict[str, Any]]] = {
        "variant": {
            "text_config.attention_bias": True,
            "text_config.attn_temperature_tuning": False,
            "text_config.rope_parameters": dict(YARN),
            "text_config.tie_word_embeddings": True,
        },
    }

    # -- config ---------------------------------------------------------------------------
    def tiny(self, vocab: int) -> Any:
        return tiny_config(vocab)

    def normalize(self, tc: dict[str, Any]) -> dict[str, Any]:
        n = int(tc["num_hidden_layers"])
        k = int(tc.get("num_experts_per_tok", 1))
        if k != 1:
            raise ModelLoadError(
                f"llama4 with num_experts_per_tok={k}: mlx-lm's llama4 block routes one expert "
                "per token only"
            )
        if n < NOPE_INTERVAL:
            raise ModelLoadError(
                f"llama4 with {n} layers: mlx-lm's llama4 takes its global attention mask from "
                f"layer {NOPE_INTERVAL - 1}, so it needs at least {NOPE_INTERVAL} layers"
            )
        step = int(tc.get("interleave_moe_layer_step") or 1)
        tc["interleave_moe_layer_step"] = step
        rule = _interleaved(n, step)
        if tc.get("moe_layers") is not None and list(tc["moe_layers"]) != rule:
            raise ModelLoadError(
                f"llama4 moe_layers {tc['moe_layers']} is not every {step}-th layer: mlx-lm's "
                "llama4 places MoE layers by interleave_moe_layer_step only"
            )
        nope = [int((i + 1) % NOPE_INTERVAL != 0) for i in range(n)]
        if tc.get("no_rope_layers") and [int(v) for v in tc["no_rope_layers"]] != nope:
            raise ModelLoadError(
                f"llama4 no_rope_layers {tc['no_rope_layers']} is not 'NoPE every "
                f"{NOPE_INTERVAL}th layer', the only pattern mlx-lm's llama4 computes"
            )
        kinds = ["chunked_attention" if rope else "full_attention" for rope in nope]
        if tc.get("layer_types") and list(tc["layer_types"]) != kinds:
            raise ModelLoadError(
                f"llama4 layer_types {tc['layer_types']} are not chunked attention on the RoPE "
                "layers and full attention on the NoPE ones, which mlx-lm's llama4 computes"
            )
        if tc.get("attention_chunk_size") is None:
            raise ModelLoadError(
                "llama4 without attention_chunk_size: mlx-lm's llama4 always chunks the "
                "attention of its RoPE layers"
            )
        tc.setdefault("attention_bias", False)
        tc.setdefault("rope_scaling", None)  # mlx-lm requires the key (Maverick: no scaling)
        tc.setdefault("use_qk_norm", True)
        return tc

    def adapt(self, model: nn.Module, tc: dict[str, Any]) -> None:
        """mlx-lm normalises q and k with eps 1e-6, transformers with `rms_norm_eps`."""
        eps = float(tc.get("rms_norm_eps", QK_EPS))
        if eps == QK_EPS:
            return
        for layer in model.layers:
            attn = layer.self_attn
            if getattr(attn, "use_qk_norm", False):
                attn.__class__ = _qk_norm_class()
                object.__setattr__(attn, "qk_eps", eps)

    def windows(self, tc: dict[str, Any]) -> list[int | None]:
        """The RoPE layers attend within chunks: their cache keeps one chunk (mlx-lm's
        ChunkedKVCache)."""
        chunk = tc.get("attention_chunk_size")
        return [chunk if k == "chunked_attention" else None for k in self.layer_kinds(tc)]

    def sparse_layers(self, tc: dict[str, Any]) -> list[int]:
        step = int(tc.get("interleave_moe_layer_step") or 1)
        return _interleaved(int(tc["num_hidden_layers"]), step)

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
        if w.shape[-1] != 1:
            raise ConfigError(f"llama4 routes one expert per token, got a set of {w.shape[-1]}")
        return x * w

    def combine(self, y: mx.array, w: mx.array) -> mx.array:
        return y.sum(axis=-2)  # the gate weight already scaled the input

    def extra(self, block: nn.Module, x: mx.array, y: mx.array) -> mx.array:
        return y + block.shared_expert(x)

    def check_top_k(self, k: int) -> None:
        if k != 1:
            raise ConfigError(
                f"--top-k {k}: llama4 routes one expert per token (its gate weight scales the "
                "expert's input); use --top-k 1 or leave it out"
            )

    def set_top_k(self, block: nn.Module, k: int) -> None:
        self.check_top_k(k)


@functools.cache
def _qk_norm_class() -> type:
    """mlx-lm's llama4 attention on a RoPE layer, q/k normalised with the config's eps."""
    from mlx_lm.models.base import scaled_dot_product_attention
    from mlx_lm.models.llama4 import Attention

    def __call__(self: Any, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        b, t, _ = x.shape
        offset = cache.offset if cache is not None else 0

        def heads(proj: Any, n: int) -> mx.array:
            return proj(x).reshape(b, t, n, -1).transpose(0, 2, 1, 3)

        q = mx.fast.rms_norm(
            self.rope(heads(self.q_proj, self.n_heads), offset=offset), None, self.qk_eps
        )
        k = mx.fast.rms_norm(
            self.rope(heads(self.k_proj, self.n_kv_heads), offset=offset), None, self.qk_eps
        )
        v = heads(self.v_proj, self.n_kv_heads)
        if cache is not None:
            k, v = cache.update_and_fetch(k, v)
        out = scaled_dot_product_attention(q, k, v, cache=cache, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, t, -1))

    return type("QkEpsAttention", (Attention,), {"__call__": __call__})


def _interleaved(n: int, step: int) -> list[int]:
    return list(range(step - 1, n, step))
