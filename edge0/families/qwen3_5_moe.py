"""Qwen3.5/3.6-MoE: Qwen3-Next's blocks under a multimodal wrapper (the text model runs).

Every layer is sparse and the top-k always renormalised (transformers' Qwen3.5 has no
such keys). Hub checkpoints fuse the experts (`experts.gate_up_proj` (E, 2F, D),
`experts.down_proj` (E, D, F)); transformers 5 `save_pretrained` writes one tensor per
expert instead, which `prepare_hf` fuses back for mlx-lm's sanitize. Its fixture is the
committed checkpoint tests/fixtures/qwen3_5_moe/ (edge0.synth.tiny); the named synthetic
shapes (`tiny`, `small`, `medium`, the 35B-A3B) are built by `shape_config`.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import mlx.core as mx
import mlx.nn as nn

from edge0.errors import ModelLoadError
from edge0.families import tiny
from edge0.families.audit import ROPE_WHY, Fields, Rope, edge0
from edge0.families.base import Family
from edge0.families.probes import longrope
from edge0.families.qwen3_moe import qwen3_fields
from edge0.families.qwen3_next import HYBRID, IRREGULAR, Qwen3Next

ARCH = "Qwen3_5MoeForConditionalGeneration"
UNREAD = "not read by transformers' Qwen3.5 (every layer sparse, top-k always renormalised)"


def _tiny(vocab: int) -> Any:
    """The hub's multimodal config (text model only): DeltaNet, then attention."""
    from transformers import Qwen3_5MoeConfig

    text = dict(
        **tiny.common(vocab, num_hidden_layers=4),
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
    )
    vision = dict(
        depth=1,
        hidden_size=16,
        num_heads=2,
        intermediate_size=32,
        out_hidden_size=tiny.D,
        patch_size=14,
        temporal_patch_size=2,
        spatial_merge_size=2,
    )
    return Qwen3_5MoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=False)


def _a3b_35b() -> dict[str, Any]:
    """Qwen3.5-35B-A3B: transformers' own defaults."""
    from transformers import Qwen3_5MoeConfig

    return dict(Qwen3_5MoeConfig(architectures=[ARCH]).to_dict())


def _a3b_35b_4layers() -> dict[str, Any]:
    """The 35B's tensors, 4 of its 40 layers."""
    from transformers import Qwen3_5MoeConfig

    text = Qwen3_5MoeConfig().to_dict()["text_config"]
    text.update(num_hidden_layers=4, layer_types=text["layer_types"][:4])
    return dict(Qwen3_5MoeConfig(text_config=text, architectures=[ARCH]).to_dict())


class Qwen3_5Moe(Qwen3Next):
    name = "qwen3_5_moe"
    model_types: ClassVar[dict[str, str]] = {
        "qwen3_5_moe": "qwen3_5_moe",
        "qwen3_5_moe_text": "qwen3_5_moe",
    }
    text_type = "qwen3_5_moe_text"
    rope_scaling_key = False  # mlx-lm's qwen3_5 reads rope_parameters itself

    fields: ClassVar[Fields] = {
        **qwen3_fields("qwen3_5_moe"),
        **{
            k: edge0(UNREAD + "; Edge0 ignores it too")
            for k in ("decoder_sparse_step", "mlp_only_layers", "norm_topk_prob")
        },
        **HYBRID,
        "rope_parameters": Rope(
            ROPE_WHY,
            partial=True,
            ignored={
                "mrope_section": "text positions are equal on all three axes",
                "mrope_interleaved": "text positions are equal on all three axes",
            },
        ),
        "tie_word_embeddings": edge0(
            "transformers ties Qwen3.5 by the top-level field, never this one; Edge0 too"
        ),
    }

    family_fixture = False
    reference_class = ARCH
    hub_fused = True
    flagships: ClassVar[dict[str, Any]] = {
        "qwen3.5-35b-a3b": _a3b_35b,
        "qwen3.5-35b-a3b-4layers": _a3b_35b_4layers,
    }
    probes: ClassVar[dict[str, dict[str, Any]]] = {
        "attention_bias": {"text_config.attention_bias": True},
        "tied": {"text_config.tie_word_embeddings": True},
        "conv_kernel": {"text_config.linear_conv_kernel_dim": 3},
        "no_norm_topk": {"text_config.norm_topk_prob": False},
        "mlp_only": {"text_config.mlp_only_layers": [1]},
        "gelu": {"text_config.hidden_act": "gelu"},
        "layer_types": {"text_config.layer_types": list(IRREGULAR)},
        "rope-longrope": {
            "text_config.rope_parameters": longrope(pairs=2, partial_rotary_factor=0.25)
        },
    }
    variants: ClassVar[dict[str, dict[str, Any]]] = {
        "variant": {
            "text_config.attention_bias": True,
            "text_config.linear_conv_kernel_dim": 3,
            "text_config.mlp_only_layers": [1],
        },
        "hybrid": {"text_config.hidden_act": "gelu", "text_config.layer_types": list(IRREGULAR)},
        # weights of its own in the wrapper's names (shared expert, experts); the conv's: 0.25
        "prelu": {"text_config.hidden_act": "prelu"},
    }

    def tiny(self, vocab: int) -> Any:
        return _tiny(vocab)

    def ties(self, config: dict[str, Any]) -> bool:
        return bool(config.get("tie_word_embeddings"))  # the wrapper's field (transformers)

    def normalize(self, tc: dict[str, Any]) -> dict[str, Any]:
        # transformers' Qwen3.5 has none of these: every layer sparse, always renormalised
        tc.update(mlp_only_layers=[], decoder_sparse_step=1, norm_topk_prob=True)
        return super().normalize(tc)

    def prepare_hf(self, weights: dict[str, mx.array], tc: dict[str, Any]) -> dict[str, mx.array]:
        return _fuse_per_expert(weights)

    def sanitize_resident(
        self, model: nn.Module, weights: dict[str, mx.array], tc: dict[str, Any], mlx: bool
    ) -> dict[str, mx.array]:
        return Family.sanitize_resident(self, model, weights, tc, mlx)

    def shape_config(self, shape: Any, vocab: int, **extra: Any) -> dict[str, Any]:
        """config.json of a synthetic `shape` (edge0.synth.shapes.Shape) with `vocab` tokens."""
        from transformers import Qwen3_5MoeConfig

        text = (
            dict(
                vocab_size=vocab,
                hidden_size=shape.hidden,
                num_hidden_layers=shape.layers,
                num_attention_heads=shape.heads,
                num_key_value_heads=shape.kv_heads,
                head_dim=shape.head_dim,
                linear_num_key_heads=shape.lin_k_heads,
                linear_num_value_heads=shape.lin_v_heads,
                linear_key_head_dim=shape.lin_head_dim,
                linear_value_head_dim=shape.lin_head_dim,
                num_experts=shape.experts,
                num_experts_per_tok=shape.top_k,
                moe_intermediate_size=shape.moe_ff,
                shared_expert_intermediate_size=shape.shared_ff,
                dtype="bfloat16",
            )
            | extra
        )
        return dict(Qwen3_5MoeConfig(text_config=text, architectures=[ARCH]).to_dict())


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
