"""Qwen3-Next: Qwen3-MoE's routing plus a sigmoid-gated shared expert; Gated DeltaNet layers.

Linear attention (Gated DeltaNet) and full attention interleave by `layer_types`, any
pattern (edge0.model.hybrid rebuilds the layers mlx-lm's every-n-th rule got wrong); the
DeltaNet's causal conv takes `hidden_act` as transformers' does. A linear-attention layer
keeps a recurrent state instead of a KV cache (`state_layer_bytes`). RMSNorms multiply by
(1 + w).
"""

from __future__ import annotations

from typing import Any, ClassVar

import mlx.core as mx
import mlx.nn as nn

from edge0.families import tiny
from edge0.families.audit import ROPE_PARTIAL, SHAPE, Fields, checked, computed
from edge0.families.base import FULL, LINEAR
from edge0.families.probes import DYNAMIC, LONGROPE, longrope
from edge0.families.qwen3_moe import Qwen3Moe, qwen3_fields
from edge0.model import hybrid
from edge0.model.activations import ACTIVATIONS

HYBRID: Fields = {
    "layer_types": checked(
        lambda v, c: _hybrid(v, c),
        "one linear_attention or full_attention a layer, at least one full_attention",
        "linear (Gated DeltaNet) or full attention per layer, any pattern (edge0/model/"
        "hybrid.py; golden-tested irregular); transformers has no mask for another kind and "
        "fails without a full-attention layer",
    ),
    "linear_conv_kernel_dim": computed("the DeltaNet's causal conv width (golden-tested at 3)"),
    "linear_key_head_dim": computed(SHAPE),
    "linear_value_head_dim": computed(SHAPE),
    "linear_num_key_heads": computed(SHAPE),
    "linear_num_value_heads": computed(SHAPE),
    "shared_expert_intermediate_size": computed(SHAPE + " (sigmoid-gated shared expert)"),
    "attention_bias": computed("mlx-lm's gated attention takes it (golden-tested)"),
    "hidden_act": checked(
        lambda v, _: v in ACTIVATIONS,
        "one of transformers' ACT2FN activations",
        "the gated MLPs', experts' and Gated DeltaNet causal conv's activation as transformers' "
        "ACT2FN computes it (edge0/model/activations.py, hybrid.py; golden-tested gelu, xielu "
        "(Qwen3-Next) and prelu (Qwen3.5)); prelu's and xielu's weights are read from the "
        "checkpoint, except the conv's: transformers builds that one afresh each call, with "
        "its initial values",
    ),
}
KINDS = {FULL, LINEAR}
# full attention where mlx-lm's every-n-th rule has none (layer 0) and a DeltaNet after it
IRREGULAR = (FULL, LINEAR, FULL, LINEAR)
PARTIAL_HALF = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}


def _tiny(vocab: int) -> Any:
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(
        **tiny.common(vocab, num_hidden_layers=4),
        intermediate_size=2 * tiny.FF,
        num_key_value_heads=tiny.KV,
        head_dim=tiny.HEAD_DIM,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=tiny.FF,
        shared_expert_intermediate_size=tiny.FF,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        norm_topk_prob=True,
    )


class Qwen3Next(Qwen3Moe):
    name = "qwen3_next"
    model_types: ClassVar[dict[str, str]] = {"qwen3_next": "qwen3_next"}
    shared = "sigmoid-gated"
    norm_default = True

    fields: ClassVar[Fields] = {
        **qwen3_fields("qwen3_next"),
        **HYBRID,
        "rope_parameters": ROPE_PARTIAL,
        "tie_word_embeddings": computed("the lm_head is the embedding"),
    }

    family_fixture = True
    centred_norms = True
    probes: ClassVar[dict[str, dict[str, Any]]] = {
        "attention_bias": {"attention_bias": True},
        "tied": {"tie_word_embeddings": True},
        "partial_rotary": {"rope_parameters": dict(PARTIAL_HALF)},
        "conv_kernel": {"linear_conv_kernel_dim": 3},
        "gelu": {"hidden_act": "gelu"},
        "layer_types": {"layer_types": list(IRREGULAR)},
        "all_linear": {"layer_types": [LINEAR] * 4},
        "rope-longrope": {"rope_parameters": longrope(pairs=2, partial_rotary_factor=0.25)},
    }
    variants: ClassVar[dict[str, dict[str, Any]]] = {
        "variant": {
            "attention_bias": True,
            "linear_conv_kernel_dim": 3,
            "mlp_only_layers": [1],
            "norm_topk_prob": False,
            "rope_parameters": {**DYNAMIC, "partial_rotary_factor": 0.5},
            "max_position_embeddings": 16,
        },
        "hybrid": {"hidden_act": "gelu", "layer_types": list(IRREGULAR)},
        # the experts' and shared expert's xIELU read from the checkpoint, the DeltaNet conv's
        # built afresh each call with transformers' initial values
        "xielu": {"hidden_act": "xielu"},
    }
    refusals: ClassVar[list[tuple[dict[str, Any], str]]] = [
        ({"layer_types": [FULL, "sliding_attention", FULL, LINEAR]}, 'layer_types=["'),
        ({"rope_parameters": dict(LONGROPE)}, "rope_parameters.short_factor=[1.0"),
    ]

    def tiny(self, vocab: int) -> Any:
        return _tiny(vocab)

    def windows(self, tc: dict[str, Any]) -> list[int | None]:
        return [None] * int(tc["num_hidden_layers"])

    def adapt(self, model: nn.Module, tc: dict[str, Any]) -> None:
        """Each layer's kind from `layer_types`, the DeltaNet conv's `hidden_act`
        (edge0.model.hybrid); mlx-lm's gated attention computes the rest (biases included)."""
        text: Any = getattr(model, "language_model", model)  # Qwen3.5: under the wrapper
        hybrid.layer_pattern(text.model, text.args, [k == LINEAR for k in self.layer_kinds(tc)])
        hybrid.conv_activation(model, str(tc.get("hidden_act", "silu")))

    def normalize(self, tc: dict[str, Any]) -> dict[str, Any]:
        super().normalize(tc)
        layer_types = tc.get("layer_types")
        if isinstance(layer_types, list) and layer_types:
            tc["full_attention_interval"] = _interval(layer_types)
        return tc

    def sanitize_resident(
        self, model: nn.Module, weights: dict[str, mx.array], tc: dict[str, Any], mlx: bool
    ) -> dict[str, mx.array]:
        if mlx:
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

    def layer_kinds(self, tc: dict[str, Any]) -> list[str]:
        if isinstance(tc.get("layer_types"), list):
            return super().layer_kinds(tc)
        n, every = int(tc["num_hidden_layers"]), int(tc.get("full_attention_interval") or 1)
        return [FULL if (i + 1) % every == 0 else LINEAR for i in range(n)]

    def state_layer_bytes(self, tc: dict[str, Any], itemsize: int) -> int:
        """The DeltaNet's conv state (kernel - 1 inputs) and its delta-rule state."""
        hk, dk = int(tc["linear_num_key_heads"]), int(tc["linear_key_head_dim"])
        hv, dv = int(tc["linear_num_value_heads"]), int(tc["linear_value_head_dim"])
        conv = (int(tc.get("linear_conv_kernel_dim", 4)) - 1) * (2 * hk * dk + hv * dv)
        return (conv + hv * dk * dv) * itemsize


def _hybrid(layer_types: Any, config: dict[str, Any]) -> bool:
    """One linear or full attention a layer and some full attention (transformers' mask
    needs a full-attention layer's cache)."""
    return (
        isinstance(layer_types, list)
        and set(layer_types) <= KINDS
        and FULL in layer_types
        and len(layer_types) == config.get("num_hidden_layers")
    )


def _interval(layer_types: list[str]) -> int:
    """mlx-lm's `full_attention_interval` for `layer_types`: its period where full attention is
    every n-th layer, else one past the last layer (all built linear; `adapt` makes the rest)."""
    n = len(layer_types)
    for every in range(1, n + 1):
        if layer_types == [FULL if (i + 1) % every == 0 else LINEAR for i in range(n)]:
            return every
    return n + 1
