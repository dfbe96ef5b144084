"""Qwen3-MoE: softmax over all experts, top-k, renormalised (norm_topk_prob); no shared expert.

Sparse layers follow the Qwen rule (`mlp_only_layers`, `decoder_sparse_step`). Its
fixture is the committed checkpoint tests/fixtures/qwen3_moe/ (edge0.synth.tiny);
the named synthetic shapes (`tiny-qwen3`, `small-qwen3`, the Qwen3-30B-A3B
flagship) are built by `shape_config`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import mlx.core as mx
import mlx.nn as nn

from edge0.families import tiny
from edge0.families.audit import ROPE, SHAPE, Fields, computed, edge0
from edge0.families.base import Family
from edge0.families.probes import YARN
from edge0.families.shared import every_layer_sparse_unless, sigmoid_gated_shared, slide
from edge0.model import attention

LAYERS = "the Qwen rule: a layer is sparse unless listed, and (i + 1) % step == 0"


def qwen3_fields(name: str) -> Fields:
    """The audit rows the Qwen3 families share."""
    return {
        "attention_bias": computed("q/k/v/o biases (golden-tested)"),
        "decoder_sparse_step": edge0(LAYERS + " (golden-tested at 2 on qwen3_moe)"),
        "mlp_only_layers": edge0(LAYERS + " (golden-tested with [1] on qwen3_next)"),
        "moe_intermediate_size": computed(SHAPE + " (experts)"),
        "norm_topk_prob": computed("renormalise the top-k weights (golden-tested both ways)"),
        "num_experts": edge0("routed experts per sparse layer (the expert records)"),
        "num_local_experts": edge0("routed experts per sparse layer (the expert records)"),
        "head_dim": computed("mlx-lm takes it (transformers: hidden_size // heads when absent)"),
        "tie_word_embeddings": computed("the lm_head is the embedding (golden-tested tied)"),
    }


def _tiny(vocab: int) -> Any:
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        **tiny.common(vocab),
        intermediate_size=2 * tiny.FF,
        num_key_value_heads=tiny.KV,
        head_dim=tiny.HEAD_DIM,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=tiny.FF,
        norm_topk_prob=True,
    )  # type: ignore[call-arg]


def _qwen3_30b_a3b() -> dict[str, Any]:
    from transformers import Qwen3MoeConfig

    return dict(
        Qwen3MoeConfig(  # type: ignore[call-arg]
            vocab_size=151936,
            hidden_size=2048,
            intermediate_size=6144,
            num_hidden_layers=48,
            num_attention_heads=32,
            num_key_value_heads=4,
            head_dim=128,
            num_experts=128,
            num_experts_per_tok=8,
            moe_intermediate_size=768,
            norm_topk_prob=True,
            max_position_embeddings=40960,
            tie_word_embeddings=False,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            architectures=["Qwen3MoeForCausalLM"],
            dtype="bfloat16",
        ).to_dict()
    )


class Qwen3Moe(Family):
    name = "qwen3_moe"
    model_types: ClassVar[dict[str, str]] = {"qwen3_moe": "qwen3_moe"}
    expert_keys = ("num_experts", "num_local_experts")
    routing = "softmax, top-k, renormalised (norm_topk_prob)"
    norm_default: ClassVar[bool] = False  # transformers' default norm_topk_prob

    fields: ClassVar[Fields] = {
        **qwen3_fields("qwen3_moe"),
        "rope_parameters": ROPE,
        "use_sliding_window": edge0("switches sliding_window on (transformers' rule)"),
        "sliding_window": computed(
            "every layer attends over its last sliding_window tokens, its KV cache keeps them "
            "(golden-tested at 4)"
        ),
    }

    family_fixture = False
    flagships: ClassVar[dict[str, Any]] = {"qwen3-30b-a3b": _qwen3_30b_a3b}
    probes: ClassVar[dict[str, dict[str, Any]]] = {
        "attention_bias": {"attention_bias": True},
        "sliding_window": {"use_sliding_window": True, "sliding_window": 4},
        "head_dim": {"head_dim": 32},
        "gelu": {"hidden_act": "gelu"},
        "tied": {"tie_word_embeddings": True},
        "sparse_step": {"decoder_sparse_step": 2},
        "mlp_only": {"mlp_only_layers": [0]},
        "no_norm_topk": {"norm_topk_prob": False},
    }
    variants: ClassVar[dict[str, dict[str, Any]]] = {
        "variant": {
            "head_dim": 32,
            "tie_word_embeddings": True,
            "decoder_sparse_step": 2,
            "norm_topk_prob": False,
            "attention_bias": True,
            "use_sliding_window": True,
            "sliding_window": 8,
        },
        # YaRN x4 over 16 positions: the prompt (and 8 decode steps) run past them
        "yarn": {"rope_parameters": dict(YARN)},
        # an activation with weights of its own, in a dense MLP (layer 0) and the experts
        "xielu": {"hidden_act": "xielu", "decoder_sparse_step": 2},
    }

    refusals: ClassVar[list[tuple[dict[str, Any], str]]] = [
        (
            {"rope_parameters": dict(YARN, partial_rotary_factor=0.5)},
            "rope_parameters.partial_rotary_factor=0.5: transformers' qwen3_moe rotates whole",
        ),
    ]

    def tiny(self, vocab: int) -> Any:
        return _tiny(vocab)

    def normalize(self, tc: dict[str, Any]) -> dict[str, Any]:
        if "num_experts" not in tc and "num_local_experts" in tc:
            tc["num_experts"] = tc["num_local_experts"]
        tc.setdefault("mlp_only_layers", [])
        tc.setdefault("decoder_sparse_step", 1)
        tc.setdefault("norm_topk_prob", self.norm_default)
        return tc

    def sparse_layers(self, tc: dict[str, Any]) -> list[int]:
        return every_layer_sparse_unless(tc)

    def select(self, block: nn.Module, scores: mx.array, k: int) -> tuple[mx.array, mx.array]:
        inds = mx.argpartition(scores, kth=-k, axis=-1)[..., -k:]  # mlx-lm's order
        return inds, self.weights(block, scores, inds)

    def extra(self, block: nn.Module, x: mx.array, y: mx.array) -> mx.array:
        return sigmoid_gated_shared(block, x, y)

    def windows(self, tc: dict[str, Any]) -> list[int | None]:
        return [tc.get("sliding_window")] * int(tc["num_hidden_layers"])

    def adapt(self, model: nn.Module, tc: dict[str, Any]) -> None:
        """q/k/v/o biases (`attention_bias`) and a sliding window on every layer, which
        mlx-lm's qwen3_moe lacks."""
        if tc.get("attention_bias"):
            for layer in model.layers:
                attention.projections(layer.self_attn, dict.fromkeys(attention.PROJECTIONS, True))
        slide(model, self.windows(tc))

    def shape_config(self, shape: Any, vocab: int, **extra: Any) -> dict[str, Any]:
        """config.json of a synthetic `shape` (edge0.synth.shapes.Shape) with `vocab` tokens."""
        from transformers import Qwen3MoeConfig

        base = dict(
            vocab_size=vocab,
            hidden_size=shape.hidden,
            intermediate_size=2 * shape.hidden,
            num_hidden_layers=shape.layers,
            num_attention_heads=shape.heads,
            num_key_value_heads=shape.kv_heads,
            head_dim=shape.head_dim,
            num_experts=shape.experts,
            num_experts_per_tok=shape.top_k,
            moe_intermediate_size=shape.moe_ff,
            norm_topk_prob=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            architectures=["Qwen3MoeForCausalLM"],
            dtype="bfloat16",
        )
        return dict(Qwen3MoeConfig(**{**base, **extra}).to_dict())
