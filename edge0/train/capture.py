"""Record each MoE layer's router input, router logits and executed top-k during a forward pass."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import attrs
import mlx.core as mx
import mlx.nn as nn
import numpy as np

from edge0.families import Family, for_model
from edge0.routing.prerouter import block_top_k, moe_blocks


class _RecordingBlock(nn.Module):
    """Wraps a sparse block: passes through, and keeps (input, router logits) of the last call."""

    def __init__(self, block: nn.Module, sink: dict[int, tuple[mx.array, mx.array]], layer: int):
        super().__init__()
        self.inner = block
        # plain attributes (object.__setattr__ keeps them out of the module's parameter tree)
        object.__setattr__(self, "_sink", sink)
        object.__setattr__(self, "_layer", layer)

    def __call__(self, x: mx.array) -> mx.array:
        self._sink[self._layer] = (x, _family(self.inner).router_logits(self.inner, x))
        out: mx.array = self.inner(x)
        return out


def _family(block: nn.Module) -> Family:
    fam: Family = object.__getattribute__(block, "_edge0_family")
    return fam


@attrs.frozen
class Routing:
    """One forward pass, per MoE layer (axis 1), as numpy.

    hidden: (B, L, S, d) post-attention-norm hidden entering each sparse block.
    logits: (B, L, S, E) router logits (pre-softmax).
    topk:   (B, L, S, k) executed experts (the router's top-k set, ascending indices).
    """

    hidden: np.ndarray
    logits: np.ndarray
    topk: np.ndarray


@contextmanager
def recording(model: nn.Module) -> Iterator[dict[int, tuple[mx.array, mx.array]]]:
    """Install recording wrappers on every MoE layer for the duration of the block."""
    sink: dict[int, tuple[mx.array, mx.array]] = {}
    blocks = moe_blocks(model)
    fam = for_model(model)
    layers = model.layers
    try:
        for layer, block in blocks:
            object.__setattr__(block, "_edge0_family", fam)
            setattr(layers[layer], fam.block_attr, _RecordingBlock(block, sink, layer))
        yield sink
    finally:
        for layer, block in blocks:
            setattr(layers[layer], fam.block_attr, block)


def run_and_record(model: nn.Module, tokens: mx.array, hidden_dtype: np.dtype) -> Routing:
    """Forward (B, S) tokens (no cache) and return the routing of every MoE layer."""
    blocks = moe_blocks(model)
    fam = for_model(model)
    k = block_top_k(blocks[0][1])
    with recording(model) as sink:
        out = model(tokens)
        layers = [i for i, _ in blocks]
        hidden = mx.stack([sink[i][0] for i in layers], axis=1)  # (B, L, S, d)
        logits = mx.stack([sink[i][1] for i in layers], axis=1).astype(mx.float32)
        # the executed set by the family's own rule (bias, groups), canonical order
        topk = mx.stack(
            [mx.sort(fam.select(b, fam.scores(b, sink[i][0]), k)[0], axis=-1) for i, b in blocks],
            axis=1,
        )
        mx.eval(out, hidden, logits, topk)
    return Routing(
        hidden=np.asarray(hidden.astype(mx.float32)).astype(hidden_dtype),
        logits=np.array(logits),
        topk=np.array(topk).astype(np.int16),
    )


def quantize_student(model: nn.Module, bits: int = 4, group_size: int = 64) -> nn.Module:
    """Quantize in place to the int4 student path (the model's predicate keeps routers 8-bit)."""
    predicate = getattr(model, "quant_predicate", None)

    def pick(path: str, module: nn.Module) -> bool | dict[str, int]:
        if not hasattr(module, "to_quantized") or module.weight.shape[-1] % group_size:
            return False
        return predicate(path, module) if predicate is not None else True

    nn.quantize(model, group_size, bits, class_predicate=pick)
    return model


def fake_quantize_student(model: nn.Module, bits: int = 4, group_size: int = 64) -> nn.Module:
    """The same int4 grid as `quantize_student`, dequantized back to float weights.

    The weights equal the values the quantized kernels compute with, so hidden states and
    routing match the int4 student up to float summation order, while fp32 matmuls run at
    BLAS speed (CPU int4 prefill is ~15x slower than fp32 with OpenBLAS).
    """
    predicate = getattr(model, "quant_predicate", None)
    for path, module in model.named_modules():
        if not hasattr(module, "to_quantized") or module.weight.shape[-1] % group_size:
            continue
        params = predicate(path, module) if predicate is not None else True
        if params is False:
            continue
        gs, nb = group_size, bits
        if isinstance(params, dict):
            gs, nb = params.get("group_size", gs), params.get("bits", nb)
        w = module.weight
        wq, scales, biases = mx.quantize(w, group_size=gs, bits=nb)
        module.weight = mx.dequantize(wq, scales, biases, group_size=gs, bits=nb).astype(w.dtype)
    mx.eval(model.parameters())
    return model
