"""The gated MLPs' activation (`hidden_act`) as transformers' ACT2FN computes it, in MLX.

mlx-lm's gated MLPs and expert SwitchGLUs hard-code SiLU: `act(gate(x)) * up(x)` with
act = silu. `install(model, name)` makes every one of them use transformers' activation
`name` instead: the experts' `activation` module is replaced (the streaming block and
chunked prefill call that same module; the native expert kernel knows SiLU only and
leaves any other to MLX), and each dense gated MLP gets a subclass computing
`down(act(gate(x)) * up(x))`. Activations with weights of their own (prelu, xielu) are
not among them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn

_SQRT_2_PI = math.sqrt(2 / math.pi)


def _gelu_tanh(x: mx.array) -> mx.array:
    return 0.5 * x * (1 + mx.tanh(_SQRT_2_PI * (x + 0.044715 * mx.power(x, 3))))


# transformers' ACT2CLS name -> the same function (fp32, op for op where order matters)
ACTIVATIONS: dict[str, Callable[[mx.array], mx.array]] = {
    "silu": nn.silu,
    "swish": nn.silu,
    "gelu": nn.gelu,
    "gelu_python": nn.gelu,
    "gelu_10": lambda x: mx.clip(nn.gelu(x), -10, 10),
    "gelu_new": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
    "gelu_python_tanh": _gelu_tanh,
    "gelu_accurate": _gelu_tanh,
    "gelu_fast": lambda x: 0.5 * x * (1 + mx.tanh(x * 0.7978845608 * (1 + 0.044715 * x * x))),
    "quick_gelu": lambda x: x * mx.sigmoid(1.702 * x),
    "laplace": lambda x: 0.5 * (1 + mx.erf((x - 0.707107) / (0.282095 * math.sqrt(2.0)))),
    "relu": nn.relu,
    "relu2": lambda x: mx.square(nn.relu(x)),
    "relu6": nn.relu6,
    "leaky_relu": lambda x: nn.leaky_relu(x, 0.01),
    "hardswish": nn.hardswish,
    "mish": nn.mish,
    "sigmoid": mx.sigmoid,
    "tanh": mx.tanh,
    "linear": lambda x: x,
    "sqrtsoftplus": lambda x: mx.sqrt(nn.softplus(x)),
}
SILU = ("silu", "swish")


class GatedActivation(nn.Module):
    """`act(gate) * x`: the experts' activation (mlx-lm's SwiGLU with another act)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def __call__(self, x: mx.array, gate: mx.array) -> mx.array:
        return ACTIVATIONS[self.name](gate) * x


@functools.cache
def _gated_class(cls: type) -> type:
    """`cls` (an mlx-lm gated MLP) computing `down(act(gate(x)) * up(x))`."""

    def __call__(self: Any, x: mx.array) -> mx.array:
        act = ACTIVATIONS[self.edge0_act]
        return self.down_proj(act(self.gate_proj(x)) * self.up_proj(x))

    return type(f"Gated{cls.__name__}", (cls,), {"__call__": __call__})


def install(model: nn.Module, name: str) -> int:
    """Make every gated MLP and expert SwitchGLU of `model` use activation `name`; returns
    how many changed (none for SiLU, mlx-lm's own)."""
    from mlx_lm.models.switch_layers import SwitchGLU

    if name in SILU:
        return 0
    n = 0
    module: nn.Module
    for _, module in model.named_modules():
        if isinstance(module, SwitchGLU):
            module.activation = GatedActivation(name)
            n += 1
        elif all(p in module for p in ("gate_proj", "up_proj", "down_proj")):
            module.__class__ = _gated_class(type(module))
            object.__setattr__(module, "edge0_act", name)
            n += 1
    return n
