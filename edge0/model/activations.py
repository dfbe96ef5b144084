"""The gated MLPs' activation (`hidden_act`) as transformers' ACT2FN computes it, in MLX.

mlx-lm's gated MLPs and expert SwitchGLUs hard-code SiLU: `act(gate(x)) * up(x)` with
act = silu. `install(model, name)` makes every one of them use transformers' activation
`name` instead: the experts' `activation` module is replaced (the streaming block and
chunked prefill call that same module; the native expert kernel knows SiLU only and
leaves any other to MLX), and each dense gated MLP gets a subclass computing
`down(act(gate(x)) * up(x))`. An activation with weights of its own (prelu, xielu) is a
module whose weights each MLP and each layer's experts read from the checkpoint
(`mlp.act_fn.*`, Llama-4's `activation_fn.*`, `mlp.experts.act_fn.*`: `rename`, `check`);
a call that builds its own, like the DeltaNet conv's, computes with its initial values.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from edge0.errors import ModelLoadError

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
BF16 = mx.bfloat16


def _bf16(x: mx.array) -> mx.array:
    """Round to bfloat16 after computing in float32 (torch's CPU bf16 ops)."""
    return x.astype(mx.float32).astype(BF16)


class PReLU(nn.Module):
    """torch's PReLU (one weight, 0.25 to start): `x` where x >= 0, else weight * x."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = mx.array([0.25])  # (1,)

    def __call__(self, x: mx.array) -> mx.array:
        return mx.where(x >= 0, x, self.weight.astype(x.dtype) * x)


class XIELU(nn.Module):
    """transformers' xIELU: softplus-parametrised alphas, beta and eps from the checkpoint.

    transformers holds all four in bfloat16 whatever dtype the model loads in, so the
    alphas' softplus and `beta + softplus(alpha_n)` are rounded to bfloat16 here too.
    """

    def __init__(self, alpha_p: float = 0.8, alpha_n: float = 0.8, beta: float = 0.5) -> None:
        super().__init__()

        def inverse_softplus(v: float) -> mx.array:  # transformers' init, step by step in bf16
            return _bf16(mx.log(_bf16(mx.expm1(mx.array(v, BF16).astype(mx.float32)))))[None]

        self.alpha_p = inverse_softplus(alpha_p)  # (1,)
        self.alpha_n = inverse_softplus(alpha_n - beta)  # (1,)
        self.beta = mx.array(beta, BF16)  # ()
        self.eps = mx.array(-1e-6, BF16)  # ()
        # evaluated now: MLX runs a lazy graph on its builder thread's stream, and the engine
        # computes on another (the DeltaNet conv's instance is built at import)
        mx.eval(self.alpha_p, self.alpha_n)

    def __call__(self, x: mx.array) -> mx.array:
        beta = self.beta.astype(BF16)
        alpha_p, soft_n = (
            _bf16(nn.softplus(_bf16(a).astype(mx.float32))) for a in (self.alpha_p, self.alpha_n)
        )
        alpha_n = _bf16(beta.astype(mx.float32) + soft_n.astype(mx.float32))
        a_p, a_n, b = (t.astype(x.dtype) for t in (alpha_p, alpha_n, beta))
        eps = self.eps.astype(BF16).astype(x.dtype)
        negative = (mx.expm1(mx.minimum(x, eps)) - x) * a_n + b * x
        return mx.where(x > 0, a_p * x * x + b * x, negative)


# activations with weights of their own: name -> the module (transformers' initial values)
WEIGHTED: dict[str, type[nn.Module]] = {"prelu": PReLU, "xielu": XIELU}
# what a call that builds its own instance computes (the DeltaNet conv: the initial values)
ACTIVATIONS.update({name: cls() for name, cls in WEIGHTED.items()})


class GatedActivation(nn.Module):
    """`act(gate) * x`: the experts' activation (mlx-lm's SwiGLU with another act)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        if name in WEIGHTED:  # its weights: the checkpoint's `experts.act_fn.*`
            self.act_fn = WEIGHTED[name]()

    def __call__(self, x: mx.array, gate: mx.array) -> mx.array:
        act = self.act_fn if "act_fn" in self else ACTIVATIONS[self.name]
        return act(gate) * x


@functools.cache
def _gated_class(cls: type) -> type:
    """`cls` (an mlx-lm gated MLP) computing `down(act(gate(x)) * up(x))`."""

    def __call__(self: Any, x: mx.array) -> mx.array:
        act = self.act_fn if "act_fn" in self else ACTIVATIONS[self.edge0_act]
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
            if name in WEIGHTED:  # its weights: the checkpoint's `mlp.act_fn.*` (or `mlp_act`)
                module.act_fn = WEIGHTED[name]()
            n += 1
    return n


def _owned(model: nn.Module, dense: str) -> dict[str, str]:
    """mlx name -> checkpoint name of every weighted activation's tensor in `model`; a dense
    MLP's module is `dense` in the checkpoint (Llama-4: `activation_fn`)."""
    from mlx_lm.models.switch_layers import SwitchGLU

    modules = dict(model.named_modules())
    out: dict[str, str] = {}
    for path, module in modules.items():
        act = module.get("act_fn")
        if not isinstance(act, PReLU | XIELU):
            continue
        switch = path.removesuffix(".activation")
        theirs = f"{path}.{dense}"
        # a SwitchGLU's activation: the checkpoint's experts (`experts.act_fn.*`) hold it
        if switch != path and isinstance(modules.get(switch), SwitchGLU):
            theirs = f"{switch.rpartition('.')[0]}.experts.act_fn"
        for leaf in dict(act.parameters()):
            out[f"{path}.act_fn.{leaf}"] = f"{theirs}.{leaf}"
    return out


def rename(
    model: nn.Module, weights: dict[str, mx.array], dense: str = "act_fn"
) -> dict[str, mx.array]:
    """The activations' tensors (sanitized names: `experts.act_fn.*`, a dense MLP's
    `<dense>.*`) under the model's (`activation.act_fn.*`, `act_fn.*`), in place."""
    for ours, theirs in _owned(model, dense).items():
        if ours != theirs and theirs in weights:
            weights[ours] = weights.pop(theirs)
    return weights


def check(
    model: nn.Module, weights: dict[str, mx.array], where: str, dense: str = "act_fn"
) -> None:
    """Raise ModelLoadError naming the first weighted activation tensor `weights` (renamed)
    lack, in the checkpoint's name."""
    owned = _owned(model, dense)
    lacking = sorted(theirs for ours, theirs in owned.items() if ours not in weights)
    if lacking:
        raise ModelLoadError(
            f"{where}: tensor {lacking[0]} is missing: hidden_act's activation has weights of "
            "its own, read from the checkpoint for every gated MLP and expert block; the "
            "checkpoint is incomplete or not this config's: re-download it"
        )
