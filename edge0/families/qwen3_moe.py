"""Qwen3-MoE, Qwen3-Next, Qwen3.5/3.6-MoE: softmax over all experts, top-k, renormalised.

Qwen3-Next and Qwen3.5 add a sigmoid-gated shared expert and interleave Gated
DeltaNet with full attention (`layer_types`). Qwen3.5 hub checkpoints fuse the
experts (`experts.gate_up_proj` (E, 2F, D), `experts.down_proj` (E, D, F));
transformers 5 `save_pretrained` writes one tensor per expert instead, which
`prepare_hf` fuses back for mlx-lm's sanitize.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import mlx.core as mx
import mlx.nn as nn

from edge0.errors import ModelLoadError
from edge0.families.base import (
    FULL,
    LINEAR,
    Family,
    every_layer_sparse_unless,
    sigmoid_gated_shared,
)


class Qwen3Moe(Family):
    name = "qwen3_moe"
    model_types: ClassVar[dict[str, str]] = {
        "qwen3_moe": "qwen3_moe",
        "qwen3_next": "qwen3_next",
        "qwen3_5_moe": "qwen3_5_moe",
        "qwen3_5_moe_text": "qwen3_5_moe",
    }
    expert_keys = ("num_experts", "num_local_experts")
    routing = "softmax, top-k, renormalised (norm_topk_prob)"
    shared = "sigmoid-gated (Qwen3-Next/3.5)"

    def normalize(self, tc: dict[str, Any]) -> dict[str, Any]:
        if "num_experts" not in tc and "num_local_experts" in tc:
            tc["num_experts"] = tc["num_local_experts"]
        if str(tc.get("model_type")).startswith("qwen3_5"):
            # transformers' Qwen3.5 has none of these: every layer sparse, always renormalised
            tc.update(mlp_only_layers=[], decoder_sparse_step=1, norm_topk_prob=True)
        tc.setdefault("mlp_only_layers", [])
        tc.setdefault("decoder_sparse_step", 1)
        tc.setdefault("norm_topk_prob", tc.get("model_type") != "qwen3_moe")
        layer_types = tc.get("layer_types")
        if isinstance(layer_types, list) and layer_types and tc.get("model_type") != "qwen3_moe":
            tc["full_attention_interval"] = _interval(layer_types)
        return tc

    def sparse_layers(self, tc: dict[str, Any]) -> list[int]:
        return every_layer_sparse_unless(tc)

    def select(self, block: nn.Module, scores: mx.array, k: int) -> tuple[mx.array, mx.array]:
        inds = mx.argpartition(scores, kth=-k, axis=-1)[..., -k:]  # mlx-lm's order
        return inds, self.weights(block, scores, inds)

    def prepare_hf(self, weights: dict[str, mx.array], tc: dict[str, Any]) -> dict[str, mx.array]:
        if not tc.get("model_type", "").startswith("qwen3_5"):
            return weights
        return _fuse_per_expert(weights)

    def sanitize_resident(
        self, model: nn.Module, weights: dict[str, mx.array], tc: dict[str, Any], mlx: bool
    ) -> dict[str, mx.array]:
        if tc.get("model_type") != "qwen3_next" or mlx:
            return super().sanitize_resident(model, weights, tc, mlx)
        # mlx-lm's qwen3_next sanitize only converts HF tensors (conv1d layout, 1 + w norms)
        # when it sees per-expert tensors: show it empty ones, then drop what it stacks
        n = int(tc["num_experts"])
        for layer in self.sparse_layers(tc):
            for e in range(n):
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    weights[f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight"] = mx.zeros((0,))
        out = model.sanitize(weights)
        return {k: v for k, v in out.items() if ".switch_mlp." not in k}

    def extra(self, block: nn.Module, x: mx.array, y: mx.array) -> mx.array:
        return sigmoid_gated_shared(block, x, y)

    def layer_kinds(self, tc: dict[str, Any]) -> list[str]:
        if isinstance(tc.get("layer_types"), list):
            return super().layer_kinds(tc)
        n, every = int(tc["num_hidden_layers"]), int(tc.get("full_attention_interval") or 1)
        return [FULL if (i + 1) % every == 0 else LINEAR for i in range(n)]

    def state_layer_bytes(self, tc: dict[str, Any], itemsize: int) -> int:
        """Qwen3-Next/3.5's DeltaNet: its conv state (kernel - 1 inputs) and delta-rule state."""
        if not tc.get("linear_num_value_heads"):
            return 0
        hk, dk = int(tc["linear_num_key_heads"]), int(tc["linear_key_head_dim"])
        hv, dv = int(tc["linear_num_value_heads"]), int(tc["linear_value_head_dim"])
        conv = (int(tc.get("linear_conv_kernel_dim", 4)) - 1) * (2 * hk * dk + hv * dv)
        return (conv + hv * dk * dv) * itemsize


_PER = re.compile(r"^(?P<pre>.*\.mlp\.experts)\.(?P<e>\d+)\.(?P<proj>gate|up|down)_proj\.weight$")


def _fuse_per_expert(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """One tensor per expert -> the hub's fused gate_up_proj (E, 2F, D) and down_proj (E, D, F)."""
    found: dict[str, dict[str, dict[int, mx.array]]] = {}
    for key in [k for k in weights if _PER.match(k)]:
        m = _PER.match(key)
        assert m is not None
        found.setdefault(m["pre"], {}).setdefault(m["proj"], {})[int(m["e"])] = weights.pop(key)
    for pre, projs in found.items():
        n = len(projs.get("gate", {}))
        if any(sorted(projs.get(p, {})) != list(range(n)) for p in ("gate", "up", "down")):
            raise ModelLoadError(
                f"{pre}: per-expert tensors are incomplete (gate/up/down for experts 0..{n - 1} "
                "expected); re-download the checkpoint"
            )
        gate = mx.stack([projs["gate"][e] for e in range(n)])  # (E, F, D)
        up = mx.stack([projs["up"][e] for e in range(n)])
        weights[f"{pre}.gate_up_proj"] = mx.concatenate([gate, up], axis=1)  # (E, 2F, D)
        weights[f"{pre}.down_proj"] = mx.stack([projs["down"][e] for e in range(n)])
    return weights


def _interval(layer_types: list[str]) -> int:
    """The period of full-attention layers; mlx-lm's Qwen3.5 only supports a regular one."""
    n = layer_types.index("full_attention") + 1 if "full_attention" in layer_types else 0
    expected = [
        "full_attention" if n and (i + 1) % n == 0 else "linear_attention"
        for i in range(len(layer_types))
    ]
    if n == 0 or expected != layer_types:
        raise ModelLoadError(
            f"layer_types {layer_types} is not 'every n-th layer is full attention'; "
            "mlx-lm's qwen3_5_moe cannot run this layer pattern"
        )
    return n
