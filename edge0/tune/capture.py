"""Routing traces from the int4 model itself, streamed under the memory budget.

Each window of calibration text is a prompt prefilled by the engine in chunks, in an
exact mode: every MoE layer routes the chunk truly and reads the union of its experts
once. A recorder around each sparse block keeps what the block received (the
post-attention-norm hidden state, the heads' input), the router's logits (their target)
and the executed top-k, so nothing runs twice and nothing but the engine's own reads
touches the disk. Traces are written a window at a time (edge0.tune.store).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from edge0.families import Family, for_model
from edge0.routing.prerouter import block_top_k, moe_blocks

Sink = dict[int, list[tuple[mx.array, mx.array, mx.array]]]  # layer -> (x, logits, topk) per call


class _Recorder(nn.Module):
    """Passes a sparse block through, and keeps its input, router logits and true top-k."""

    def __init__(self, block: nn.Module, layer: int, family: Family, k: int, sink: Sink):
        super().__init__()
        self.inner = block
        # plain attributes (object.__setattr__ keeps them out of the module's parameter tree)
        for name, value in (("_layer", layer), ("_family", family), ("_k", k), ("_sink", sink)):
            object.__setattr__(self, name, value)

    def __call__(self, x: mx.array) -> mx.array:
        fam, block = self._family, self.inner
        logits = fam.router_logits(block, x).astype(mx.float32)  # (1, C, E)
        topk = mx.sort(fam.select(block, fam.scores(block, x), self._k)[0], axis=-1)
        self._sink.setdefault(self._layer, []).append((x.astype(mx.float16), logits, topk))
        out: mx.array = block(x)
        return out


@contextmanager
def recording(model: nn.Module) -> Iterator[Sink]:
    """Recorders around every MoE layer's block while the `with` body runs (compute thread)."""
    sink: Sink = {}
    blocks = moe_blocks(model)
    fam = for_model(model)
    k = block_top_k(blocks[0][1])
    try:
        for layer, block in blocks:
            setattr(model.layers[layer], fam.block_attr, _Recorder(block, layer, fam, k, sink))
        yield sink
    finally:
        for layer, block in blocks:
            setattr(model.layers[layer], fam.block_attr, block)


def window_routing(sink: Sink, layers: tuple[int, ...], n: int) -> tuple[np.ndarray, ...]:
    """The first `n` tokens of what the recorders kept, per layer: hidden (L, n, d) float16,
    topk (L, n, k) int16, logits (L, n, E) float32. Evaluates them (compute thread)."""
    parts = [
        [mx.concatenate([c[i] for c in sink[layer]], axis=1)[0, :n] for layer in layers]
        for i in range(3)
    ]
    mx.eval(*parts[0], *parts[1], *parts[2])
    hidden, logits, topk = (np.stack([np.array(a) for a in p]) for p in parts)
    return hidden, topk.astype(np.int16), logits


def prefill_job(engine: Any, ids: list[int]) -> Callable[[], tuple[np.ndarray, ...]]:
    """A job for the engine's compute thread: prefill `ids` as a fresh request and return
    the window's routing (`window_routing`)."""
    from edge0.runtime.compute.runner import Runner, greedy
    from edge0.runtime.prefill.chunks import prefill

    setup = engine.setup
    layers = tuple(i for i, _ in moe_blocks(setup.model))

    def job() -> tuple[np.ndarray, ...]:
        with recording(setup.model) as sink:
            runner = Runner(setup.model, setup.ctx, -1, greedy)
            try:
                prefill(runner, ids, decode=False)
                return window_routing(sink, layers, len(ids))
            finally:
                runner.finish()

    return job
