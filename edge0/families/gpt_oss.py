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
import numpy as np

from edge0.errors import ModelLoadError
from edge0.families.base import LogitsTopK

MXFP4 = {"group_size": 32, "bits": 4, "mode": "mxfp4"}
# mlx-lm's SwigluOAI uses these constants whatever the config says
ALPHA, LIMIT = 1.702, 7.0
_EXPERTS = re.compile(
    r"^(?P<pre>.*layers\.(?P<layer>\d+)\.mlp\.experts)\."
    r"(?P<proj>gate_up_proj|down_proj)(?P<part>|_bias|_blocks|_scales)$"
)


class GptOss(LogitsTopK):
    name = "gpt_oss"
    model_types: ClassVar[dict[str, str]] = {"gpt_oss": "gpt_oss"}
    expert_keys = ("num_local_experts",)
    switch_attr = "experts"
    router_attr = "router"
    routing = "top-k of biased logits, softmax over the k"

    def normalize(self, tc: dict[str, Any]) -> dict[str, Any]:
        alpha, limit = tc.get("swiglu_alpha", ALPHA), tc.get("swiglu_limit", LIMIT)
        if (alpha, limit) != (ALPHA, LIMIT):
            raise ModelLoadError(
                f"gpt_oss with swiglu_alpha={alpha}, swiglu_limit={limit}: mlx-lm's gpt_oss "
                f"computes alpha={ALPHA}, limit={LIMIT} only, so it would not compute this model"
            )
        return tc

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
