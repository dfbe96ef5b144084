"""gpt-oss: biased router, top-k of the logits then softmax over the k; biased clamped SwiGLU.

The block is `mlp.router` (Linear with bias) and `mlp.experts` (mlx-lm's SwitchGLU
with per-expert biases on gate/up/down and the SwigluOAI activation: the gate clipped
from above at `swiglu_limit`, the linear part clipped to +-limit, (x + 1) * gate *
sigmoid(alpha * gate)). The expert records carry the three biases (`*.bias` fields),
the streaming block adds them after each projection as mlx-lm's QuantizedSwitchLinear
does. Checkpoints come in two expert layouts:
- transformers' `save_pretrained`: `experts.gate_up_proj` (E, d, 2F) with gate and up
  interleaved along the last axis, `experts.down_proj` (E, F, d), `*_bias` tensors;
- the hub's MXFP4 checkpoints: `experts.{gate_up,down}_proj_blocks` (E, out, in/32, 16)
  uint8 and `_scales` (E, out, in/32) uint8 (gate/up interleaved by rows), kept packed as
  MLX's `mode="mxfp4"` (group 32), never requantized.
Sliding and full attention alternate by `layer_types`; mlx-lm's model handles both.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.activations import SwigluOAI

from edge0.families import tiny
from edge0.families.audit import (
    EXPERTS,
    ROPE,
    SHAPE,
    TIED_OK,
    Fields,
    computed,
    edge0,
    irrelevant,
)
from edge0.families.base import FULL, SLIDING, Form, Written
from edge0.families.probes import YARN
from edge0.families.shared import LogitsTopK
from edge0.model import attention

MXFP4 = {"group_size": 32, "bits": 4, "mode": "mxfp4"}
# mlx-lm's gpt_oss builds its SwigluOAI with these whatever the config says
ALPHA, LIMIT = 1.702, 7.0
_EXPERTS = re.compile(
    r"^(?P<pre>.*layers\.(?P<layer>\d+)\.mlp\.experts)\."
    r"(?P<proj>gate_up_proj|down_proj)(?P<part>|_bias|_blocks|_scales)$"
)

# gpt-oss-20b's released rope (YaRN x32 over 4096, `truncate: false`)
RELEASED_ROPE = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
    "rope_theta": 150000.0,
}


def _tiny(vocab: int) -> Any:
    from transformers import GptOssConfig

    # the released rope with `truncate: true` (mlx-lm's own rounding); the hub's `truncate:
    # false` is the gpt_oss-variant fixture (edge0/model/rope.py); sliding window 4 so the
    # prompt crosses it
    return GptOssConfig(
        **tiny.common(vocab, num_hidden_layers=4, max_position_embeddings=131072),
        intermediate_size=tiny.FF,
        num_key_value_heads=tiny.KV,
        head_dim=tiny.HEAD_DIM,
        num_local_experts=8,
        num_experts_per_tok=2,
        sliding_window=4,
        rope_parameters=dict(RELEASED_ROPE, truncate=True),
    )


def _gpt_oss(layers: int, experts: int) -> Any:
    from transformers import GptOssConfig

    return GptOssConfig(
        vocab_size=201088,
        hidden_size=2880,
        intermediate_size=2880,
        num_hidden_layers=layers,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=64,
        num_local_experts=experts,
        num_experts_per_tok=4,
        sliding_window=128,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_parameters=dict(RELEASED_ROPE),
        tie_word_embeddings=False,
        dtype="bfloat16",
    )


def _hub_mxfp4(weights: dict[str, mx.array], config: dict[str, Any]) -> Written:
    """The hub's original release layout (openai/gpt-oss-*): experts as MXFP4 `*_blocks`
    (E, out, in/32, 16) uint8 and `*_scales` (E, out, in/32) uint8, gate and up interleaved
    by rows, `quantization_config.quant_method = "mxfp4"`; everything else as it is. The
    packing is MLX's `mode="mxfp4"` (what mlx-lm reads the hub files as)."""
    tensors: dict[str, mx.array] = {}
    for key, value in weights.items():
        if key.endswith((".experts.gate_up_proj", ".experts.down_proj")):
            w = value.astype(mx.float32).swapaxes(-1, -2)  # (E, out, in): rows interleaved
            wq, scales = mx.quantize(w, group_size=32, bits=4, mode="mxfp4")[:2]
            e, rows, cols = w.shape
            tensors[f"{key}_blocks"] = wq.view(mx.uint8).reshape(e, rows, cols // 32, 16)
            tensors[f"{key}_scales"] = scales
        else:
            tensors[key] = value
    keep = [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ]
    quant = {"quant_method": "mxfp4", "modules_to_not_convert": keep}
    return tensors, dict(config, quantization_config=quant), "pt"


def _mlx_names(weights: dict[str, mx.array], config: dict[str, Any]) -> Written:
    """The same float weights under mlx-lm's names (`mlp.experts.gate_proj.weight` (E, F, d),
    `...gate_proj.bias`), the form of an mlx-community bf16 repository: mlx-lm's `sanitize`
    reads this and the hub's MXFP4 form, not transformers' (E, d, 2F) tensors."""
    return GptOss().prepare_hf(dict(weights), config), config, "mlx"


class GptOss(LogitsTopK):
    name = "gpt_oss"
    model_types: ClassVar[dict[str, str]] = {"gpt_oss": "gpt_oss"}
    expert_keys = ("num_local_experts",)
    switch_attr = "experts"
    router_attr = "router"
    routing = "top-k of biased logits, softmax over the k"
    hidden_act = False  # its experts' clamped SwiGLU has its own constants

    fields: ClassVar[Fields] = {
        "num_local_experts": edge0(EXPERTS),
        "rope_parameters": ROPE,
        "attention_bias": computed("q/k/v/o biases, on or off (golden-tested off)"),
        "head_dim": computed(SHAPE),
        "sliding_window": computed("the window of sliding_attention layers (fixture: 4)"),
        "layer_types": computed("sliding or full attention per layer, any pattern (golden-tested)"),
        "swiglu_alpha": computed("the clamped SwiGLU's sigmoid slope (native kernel included)"),
        "swiglu_limit": computed("the clamped SwiGLU's clamp (golden-tested at 5)"),
        "hidden_act": irrelevant("transformers' gpt-oss experts use their own clamped SwiGLU"),
        "tie_word_embeddings": computed(TIED_OK),
    }

    flagships: ClassVar[dict[str, Any]] = {
        "gpt-oss-20b": lambda: _gpt_oss(24, 32),
        "gpt-oss-120b": lambda: _gpt_oss(36, 128),
    }
    expert_mode = "mxfp4"
    probes: ClassVar[dict[str, dict[str, Any]]] = {
        "no_attention_bias": {"attention_bias": False},
        "yarn_untruncated": {"rope_parameters": dict(YARN, truncate=False)},
        "rope_default": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
        "tied": {"tie_word_embeddings": True},
        "all_full": {"layer_types": ["full_attention"] * 4},
        "all_sliding": {"layer_types": ["sliding_attention"] * 4},
        "swiglu_limit": {"swiglu_limit": 5.0},
        "swiglu_alpha": {"swiglu_alpha": 1.0},
        "yarn_attention_factor": {"rope_parameters": dict(RELEASED_ROPE, attention_factor=1.3)},
    }
    variants: ClassVar[dict[str, dict[str, Any]]] = {
        "variant": {"rope_parameters": dict(RELEASED_ROPE)},
        "sliding": {
            "rope_parameters": dict(RELEASED_ROPE, attention_factor=1.3),
            "attention_bias": False,
            "swiglu_limit": 5.0,
            "swiglu_alpha": 1.5,
            "layer_types": ["sliding_attention"] * 4,
        },
    }
    forms: ClassVar[dict[str, Form]] = {"gpt_oss_mxfp4": _hub_mxfp4}

    def tiny(self, vocab: int) -> Any:
        return _tiny(vocab)

    def mlx_lm_form(self, weights: dict[str, mx.array], config: dict[str, Any]) -> Written:
        return _mlx_names(weights, config)

    def mlx_config(self, tc: dict[str, Any]) -> dict[str, Any]:
        """mlx-lm's gpt_oss needs a sliding and a full layer to build (it indexes one of each
        for its masks): one of a single kind is built mixed, `adapt` restores it."""
        tc = super().mlx_config(tc)
        kinds = tc.get("layer_types") or []
        if len(kinds) > 1 and len(set(kinds)) == 1:
            tc = {**tc, "layer_types": [SLIDING, FULL, *kinds[2:]]}
        return tc

    def adapt(self, model: nn.Module, tc: dict[str, Any]) -> None:
        """The config's layer kinds, attention biases and clamped SwiGLU, where mlx-lm's class
        hard-codes them."""
        if tc.get("layer_types"):
            model.model.layer_types = list(tc["layer_types"])
        alpha, limit = float(tc.get("swiglu_alpha", ALPHA)), float(tc.get("swiglu_limit", LIMIT))
        for layer in model.layers:
            if not tc.get("attention_bias", True):
                attention.projections(layer.self_attn, dict.fromkeys(attention.PROJECTIONS, False))
            if (alpha, limit) != (ALPHA, LIMIT):
                layer.mlp.experts.activation = SwigluOAI(alpha, limit)

    def hf_quantization(self, hf_quant: dict[str, Any]) -> dict[str, Any] | None:
        """The MLX quantization of an HF `quantization_config` whose experts stay packed."""
        return dict(MXFP4) if hf_quant.get("quant_method") == "mxfp4" else None

    # -- checkpoint tensors --------------------------------------------------------------
    def fused_expert(self, name: str) -> tuple[int, str] | None:
        m = _EXPERTS.match(name)
        return None if m is None else (int(m["layer"]), m["proj"] + m["part"])

    def read_fused(self, read: Any, keys: set[str], expert: int) -> dict[str, Any]:
        out: dict[str, tuple[np.ndarray, str]] = {}
        if "gate_up_proj_blocks" in keys:  # hub MXFP4, (out, in/32, 16) bytes per expert
            for proj, src in (("gate_proj", "gate_up_proj"), ("down_proj", "down_proj")):
                blocks = read(f"{src}_blocks", expert)[0]
                packed = blocks.reshape(blocks.shape[0], -1).view(np.uint32)
                out[f"{proj}.weight"] = packed, "uint32"
                out[f"{proj}.scales"] = read(f"{src}_scales", expert)
        else:  # transformers: gate_up (d, 2F), down (F, d) per expert
            gate_up, dtype = read("gate_up_proj", expert)
            out["gate_proj"], out["up_proj"] = (gate_up.T, dtype), (gate_up.T, dtype)
            down, dtype = read("down_proj", expert)
            out["down_proj"] = down.T, dtype
        out["gate_proj.bias"] = out["up_proj.bias"] = read("gate_up_proj_bias", expert)
        out["down_proj.bias"] = read("down_proj_bias", expert)
        for key in [k for k in out if k.startswith("gate_proj")]:  # gate and up interleave
            (both, dtype), up = out[key], key.replace("gate_proj", "up_proj")
            out[key], out[up] = (both[::2], dtype), (both[1::2], dtype)
        return {k: (np.ascontiguousarray(v), d) for k, (v, d) in out.items()}

    def prepare_hf(self, weights: dict[str, mx.array], tc: dict[str, Any]) -> dict[str, mx.array]:
        """transformers' (E, d, 2F) / (E, F, d) expert tensors -> mlx-lm's switch names."""
        for key in [k for k in weights if k.endswith(".mlp.experts.gate_up_proj")]:
            pre = key.rpartition(".")[0]
            gate_up, down = weights.pop(key), weights.pop(f"{pre}.down_proj")
            weights[f"{pre}.gate_proj.weight"] = mx.contiguous(gate_up[..., ::2].swapaxes(-1, -2))
            weights[f"{pre}.up_proj.weight"] = mx.contiguous(gate_up[..., 1::2].swapaxes(-1, -2))
            weights[f"{pre}.down_proj.weight"] = mx.contiguous(down.swapaxes(-1, -2))
            gu_bias = weights.pop(f"{pre}.gate_up_proj_bias")
            weights[f"{pre}.gate_proj.bias"] = mx.contiguous(gu_bias[..., ::2])
            weights[f"{pre}.up_proj.bias"] = mx.contiguous(gu_bias[..., 1::2])
            weights[f"{pre}.down_proj.bias"] = weights.pop(f"{pre}.down_proj_bias")
        return weights
