"""Chunked prefill: the prompt runs C tokens per forward; each streamed layer reads its union once.

Per chunk (one model call over C tokens: attention, Gated DeltaNet and the
resident layers handle multi-token input with the KV cache as they are):
  1. each streaming block computes the chunk's true routing (every mode: the
     prompt is known, so route mode needs no prediction here);
  2. in hint/route the head owned by the layer runs on the chunk's LAST token
     (its executed set and the one before it as temporal inputs, exactly the
     inputs one-token prefill gives it), predicting the first decode step;
  3. the union of the chunk's experts is staged and computed in groups
     (edge0.runtime.chunk_moe); the experts predicted for the first decode step
     are staged last, so they are still in the slots when decode starts.
After the prompt, the predictions of the last token become the first decode
step's plan and prefetch, as if the prompt had run one token at a time.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import attrs
import mlx.core as mx
import mlx.nn as nn
import numpy as np

from edge0.runtime.chunk_moe import chunk_experts

if TYPE_CHECKING:
    from edge0.runtime.block import StreamingMoE
    from edge0.runtime.runner import Runner, StreamContext

DEFAULT_CHUNK = 256  # prompt tokens per forward (docs/benchmarks/prefill.md)


@attrs.define
class ChunkState:
    """One chunk in flight: its first position and the predictions for the first decode step."""

    ctx: StreamContext
    start: int  # request position of the chunk's first token
    pending: dict[int, list[int]] = attrs.field(factory=dict)  # target layer -> experts

    def substep(self) -> None:
        """Start the next scheduler sub-step (every graph so far is evaluated)."""
        ctx = self.ctx
        ctx.step += 1
        if ctx.scheduler is not None:
            ctx.scheduler.begin_step(ctx.step)

    def prefetch(self, layer: int, experts: list[int]) -> None:
        assert self.ctx.scheduler is not None
        self.ctx.scheduler.prefetch(layer, self.ctx.step + 1, experts)

    def decode_set(self, layer: int) -> list[int] | None:
        return self.pending.get(layer)


def block_call(block: StreamingMoE, x: mx.array) -> mx.array:
    """The streaming block on a chunk `x` (1, T, d): true routing, union staged, experts applied."""
    ctx, fam, layer = block.ctx, block.family, block.layer
    st = ctx.chunk
    assert st is not None
    t = x.shape[1]
    scores = fam.scores(block, x)  # (1, T, E)
    inds, w = fam.select(block, scores, ctx.top_k)  # (1, T, K) each
    pred = ctx.predictor
    heads = pred is not None and ctx.mode in ("hint", "route") and layer in pred.targets
    last = inds[:, -1:, :]  # (1, 1, K): the executed set of the last prompt token so far
    prev_mx = inds[:, -2:-1, :] if t > 1 else ctx.prev_inds.get(layer)
    graph = pred.graph(layer, x[:, -1:, :], last, prev_mx, ctx.top_k) if heads and pred else None
    t0, c0 = time.perf_counter(), time.thread_time()
    mx.eval([a for a in (inds, w, graph) if a is not None])
    ctx.span("eval", layer, t0, time.perf_counter(), time.thread_time() - c0)
    true = np.array(inds.reshape(t, -1))  # (T, K)
    _after_routing(ctx, layer, x, true, last, graph)
    y = chunk_experts(block, x, true, st)  # (1, T, K, d)
    y = (y * w[..., None]).sum(axis=-2)
    return fam.extra(block, x, y)


def _after_routing(
    ctx: StreamContext, layer: int, x: mx.array, true: np.ndarray, last: mx.array,
    graph: mx.array | None,
) -> None:  # fmt: skip
    """Record the chunk's routing; keep the last token's prediction for the first decode step."""
    st = ctx.chunk
    assert st is not None
    ctx.cur.layers += 1
    if ctx.recording is not None:
        for i, row in enumerate(true.tolist()):
            ctx.recording[(st.start + i, layer)] = row
    rows: list[list[int]] = true.tolist()
    prev = rows[-2] if len(rows) > 1 else ctx.prev_executed.get(layer)
    ctx.prev_executed[layer] = rows[-1]
    ctx.prev_inds[layer] = last
    pred = ctx.predictor
    if pred is None or ctx.mode not in ("hint", "route") or layer not in pred.targets:
        return
    if graph is not None:
        experts: list[int] | None = graph.tolist()  # type: ignore[assignment]
    else:
        x_last = x[:, -1:, :]
        experts = pred.predict(layer, ctx.pos, x_last, rows[-1], rows[-1], prev, ctx.top_k)
    if experts is not None:
        st.pending[pred.targets[layer]] = experts


class _LastPosition(nn.Module):
    """The model's final norm applied to the last position only (the output head follows)."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm

    def __call__(self, h: mx.array) -> mx.array:
        return self.norm(h[:, -1:, :])  # (1, 1, d): logits of one row, not of the chunk


@contextlib.contextmanager
def last_position_only(model: nn.Module) -> Iterator[None]:
    """Compute the output head for the chunk's last token alone (not T x vocab logits).

    mlx-lm's text models end in `self.norm(h)` before the head; the norm is swapped
    for the call. A model without that shape runs unchanged (all positions).
    """
    inner: Any = getattr(model, "language_model", model)
    inner = getattr(inner, "model", None)
    norm = getattr(inner, "norm", None) if inner is not None else None
    if not isinstance(norm, nn.Module):
        yield
        return
    inner.norm = _LastPosition(norm)
    try:
        yield
    finally:
        inner.norm = norm


def run_chunk(runner: Runner, tokens: list[int]) -> tuple[int, ChunkState]:
    """One forward over `tokens` (len > 1); the sampled token after the last one."""
    ctx = runner.ctx
    t0, c0 = time.perf_counter(), time.thread_time()
    ctx.begin_step(prefill=True)  # one record and one fence for the whole chunk
    st = ChunkState(ctx, ctx.pos)
    ctx.pos += len(tokens) - 1  # the position of the chunk's last token
    ctx.chunk = st
    try:
        with last_position_only(runner.model):
            logits = runner.model(mx.array([tokens]), cache=runner.cache)[:, -1, :]  # (1, vocab)
        nxt = runner.sampler(logits)
        t1, c1 = time.perf_counter(), time.thread_time()
        mx.eval(nxt)  # the chunk's fence
    finally:
        ctx.chunk = None
    t2, c2 = time.perf_counter(), time.thread_time()
    ctx.span("eval", -1, t1, t2, c2 - c1)
    ctx.cur.cpu = c2 - c0
    if ctx.mode == "resident":
        ctx.cur.layers = runner.n_layers
    ctx.end_step(t2 - t0)
    return int(nxt.item()), st  # type: ignore[arg-type]


def chunked_prefill(runner: Runner, tokens: list[int], chunk: int) -> int:
    """Feed the prompt `chunk` tokens per forward; return the first generated token."""
    nxt, last = -1, None
    for start in range(0, len(tokens), chunk):
        piece = tokens[start : start + chunk]
        if len(piece) == 1:  # the one-token step plans the first decode step itself
            nxt, last = runner.feed(piece[0], prefill=True), None
        else:
            nxt, last = run_chunk(runner, piece)
    if last is not None:
        plan_first_decode(runner.ctx, last.pending)
    return nxt


def plan_first_decode(ctx: StreamContext, pending: dict[int, list[int]]) -> None:
    """The last prompt token's predictions: the first decode step's plan and its prefetch."""
    step = ctx.step + 1
    for target, experts in pending.items():
        ctx.predictions[(target, step)] = (step, experts)
        if ctx.scheduler is not None:
            ctx.scheduler.prefetch(target, step, experts)
