"""Chunked prefill: the prompt runs C tokens per forward; each streamed layer reads its union once
(docs/runtime.md, "Prompt processing").
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import mlx.core as mx
import mlx.nn as nn
import numpy as np

from edge0.kernels.native import prompt_threads
from edge0.runtime.compute.runner import Runner, greedy
from edge0.runtime.compute.steps import Steps
from edge0.runtime.layers.block import StreamingMoE
from edge0.runtime.layers.streams import LayerStream
from edge0.runtime.prefill.ahead import check_overlap, next_union
from edge0.runtime.prefill.chunk_moe import chunk_experts
from edge0.runtime.prefill.dense import dense_linears
from edge0.runtime.prefill.memory import bounded_recurrence

OVERLAP = "router"  # read the next layer's predicted first group early: "router", "heads"; "none"
# ... when the chunk's T x K picks are at least COVER x E: its union then covers most of a
# layer (each expert missed with probability ~exp(-T K / E) <= 14%), so few early reads miss
COVER = 2


class PromptCancelled(Exception):
    """The request was cancelled while its prompt ran (its consumer went away): the prompt
    stopped at the next layer, expert group or recurrent piece, not at the chunk's end."""


@attrs.define
class ChunkState:
    """One chunk in flight: its first position and the predictions for the first decode step."""

    steps: Steps
    start: int  # request position of the chunk's first token
    cancelled: Callable[[], bool] | None = None  # the request's cancel flag, read on the way
    pending: dict[int, tuple[LayerStream, list[int]]] = attrs.field(factory=dict)  # by target
    next_token: int = -1  # sampled after the chunk's last token
    following: dict[int, StreamingMoE] = attrs.field(factory=dict)  # layer -> next streamed block
    predicted: dict[int, list[int]] = attrs.field(factory=dict)  # layer -> its predicted union
    ahead: dict[int, list[int]] = attrs.field(factory=dict)  # layer -> experts read early

    def check(self) -> None:
        """Raise PromptCancelled if the request was cancelled (called between layers, expert
        groups and recurrent pieces: a long chunk stops within one of them)."""
        if self.cancelled is not None and self.cancelled():
            raise PromptCancelled

    def substep(self) -> None:
        """Start the next scheduler sub-step (every graph so far is evaluated)."""
        self.steps.substep()

    def prefetch(self, layer: int, experts: list[int], ahead: int = 1) -> None:
        """Stage `experts` of `layer` for the sub-step `ahead` of this one."""
        assert self.steps.scheduler is not None
        self.steps.scheduler.prefetch(layer, self.steps.step + ahead, experts)

    def acquire(self, layer: int, experts: list[int]) -> list[int]:
        """Slots of `experts` of `layer` for this sub-step (blocks until they are staged)."""
        steps = self.steps
        assert steps.scheduler is not None
        t0, c0 = time.perf_counter(), time.thread_time()
        slots = steps.scheduler.acquire(layer, steps.step, experts, fenced=True)
        steps.span("wait", layer, t0, time.perf_counter(), time.thread_time() - c0)
        return slots

    def decode_set(self, layer: int) -> list[int] | None:
        got = self.pending.get(layer)
        return None if got is None else got[1]

    def forward(self, block: StreamingMoE, x: mx.array) -> mx.array:
        """The chunk's executor: a streaming block's input is this chunk (`block_call`)."""
        return block_call(block, x, self)


def block_call(block: StreamingMoE, x: mx.array, st: ChunkState) -> mx.array:
    """The streaming block on chunk `st`'s input `x` (1, T, d): true routing, union staged,
    experts applied."""
    stream, fam = block.stream, block.family
    steps, head = stream.steps, stream.head
    t = x.shape[1]
    st.check()
    scores = fam.scores(block, x)  # (1, T, E)
    inds, w = fam.select(block, scores, stream.top_k)  # (1, T, K) each
    last = inds[:, -1:, :]  # (1, 1, K): the executed set of the chunk's last token
    prev_mx = inds[:, -2:-1, :] if t > 1 else stream.prev_inds
    graph = head.graph(x[:, -1:, :], last, prev_mx, stream.top_k) if head is not None else None
    nxt = None
    following = st.following.get(stream.layer)
    if following is not None and t * stream.top_k < COVER * scores.shape[-1]:
        following = None  # a short chunk: its union covers little of a layer
    if following is not None:  # the next streamed layer's union, predicted
        nxt = next_union(OVERLAP, block, following, x, inds)
    t0, c0 = time.perf_counter(), time.thread_time()
    mx.eval([a for a in (inds, w, graph, nxt) if a is not None])  # one eval per layer
    steps.span("eval", stream.layer, t0, time.perf_counter(), time.thread_time() - c0)
    true = np.array(inds.reshape(t, -1))  # (T, K)
    if following is not None and nxt is not None:
        st.predicted[following.layer] = by_count(np.array(nxt).reshape(-1))
    _after_routing(stream, st, x, true, last, graph)
    y = chunk_experts(block, fam.expert_input(x, w), true, st)  # (1, T, K, d)
    return fam.extra(block, x, fam.combine(y, w))


def _after_routing(
    stream: LayerStream,
    st: ChunkState,
    x: mx.array,
    true: np.ndarray,
    last: mx.array,
    graph: mx.array | None,
) -> None:
    """Record the chunk's routing; keep the last token's prediction for the first decode step."""
    steps, layer = stream.steps, stream.layer
    steps.cur.layers += 1
    rows: list[list[int]] = true.tolist()
    if steps.recording is not None:
        for i, row in enumerate(rows):
            steps.recording[(st.start + i, layer)] = row
    prev = rows[-2] if len(rows) > 1 else stream.prev_experts
    stream.prev_experts, stream.prev_inds = rows[-1], last
    head = stream.head
    if head is None:
        return
    experts: list[int] | None
    if graph is not None:
        experts = graph.tolist()  # type: ignore[assignment]
    else:
        x_last = x[:, -1:, :]
        experts = head.predictor.predict(
            layer, steps.pos, x_last, rows[-1], rows[-1], prev, stream.top_k
        )
    if experts is not None:
        st.pending[head.target.layer] = (head.target, experts)


def by_count(experts: np.ndarray) -> list[int]:
    """The distinct experts of `experts`, the most frequent first (ties: lower index first)."""
    ids, counts = np.unique(experts, return_counts=True)
    return [int(e) for e in ids[np.argsort(-counts, kind="stable")]]


def next_blocks(model: nn.Module, steps: Steps) -> dict[int, StreamingMoE]:
    """Each streaming block's layer -> the next streamed (slot-served) block, in compute order."""
    from edge0.runtime.layers.block import StreamingMoE
    from edge0.runtime.layers.streams import ResidentExperts

    blocks = sorted((m.layer, m) for _, m in model.named_modules() if isinstance(m, StreamingMoE))
    streamed = [b for _, b in blocks if not isinstance(b.stream.experts, ResidentExperts)]
    out: dict[int, StreamingMoE] = {}
    for layer, _ in blocks:
        later = [b for b in streamed if b.layer > layer]
        if later:
            out[layer] = later[0]
    return out


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


def run_chunk(
    runner: Runner, tokens: list[int], cancelled: Callable[[], bool] | None = None
) -> ChunkState:
    """One forward over `tokens` (len > 1): the KV cache and every layer's state advance.
    `cancelled`: read on the way; True raises PromptCancelled (the request is then dropped)."""
    steps = runner.steps
    t0, c0 = time.perf_counter(), time.thread_time()
    st = ChunkState(steps, steps.pos + 1, cancelled)  # the step's position: the chunk's first
    steps.begin_step(prefill=True, prefetch=False, executor=st)  # one record, one fence
    check_overlap(OVERLAP)
    if OVERLAP != "none" and steps.scheduler is not None:
        st.following = next_blocks(runner.model, steps)
    steps.pos += len(tokens) - 1  # the position of the chunk's last token
    with prompt_threads():  # the layers' evaluations and the chunk's fence
        with (
            last_position_only(runner.model),
            dense_linears(runner.model),
            bounded_recurrence(runner.model, check=st.check),
        ):
            logits = runner.model(mx.array([tokens]), cache=runner.cache)[:, -1, :]  # (1, V)
        nxt = runner.sampler(logits)
        t1, c1 = time.perf_counter(), time.thread_time()
        mx.eval(nxt)  # the chunk's fence
    t2, c2 = time.perf_counter(), time.thread_time()
    steps.span("eval", -1, t1, t2, c2 - c1)
    steps.cur.cpu = c2 - c0
    steps.cur.layers += runner.uncounted
    steps.end_step(t2 - t0)
    st.next_token = int(nxt.item())  # type: ignore[arg-type]
    return st


def prefill(runner: Runner, tokens: list[int], decode: bool = True) -> int:
    """Feed the prompt; return the first generated token: `prefill_chunk` tokens per
    forward when the step clock says so, else one token per step (`Runner.prefill`)."""
    if runner.steps.prefill_chunk > 1 and len(tokens) > 1:
        return chunked_prefill(runner, tokens, runner.steps.prefill_chunk, decode)
    return runner.prefill(tokens, decode)


def chunked_prefill(
    runner: Runner,
    tokens: list[int],
    chunk: int,
    decode: bool = True,
    cancelled: Callable[[], bool] | None = None,
) -> int:
    """Feed the prompt `chunk` tokens per forward; return the token sampled after it.

    Only the last forward draws with the request's sampler (the others take the
    greedy argmax, which nobody uses), so a seeded sampler's first draw is the
    first generated token, as in one-token prefill. The last token's predictions
    are planned and prefetched only when a decode step follows (`decode`).
    `cancelled` (the request's flag) is read between chunks and inside each one
    (ChunkState.check): when it turns True, PromptCancelled is raised.
    """
    sampler = runner.sampler
    nxt, last = -1, None
    try:
        for start in range(0, len(tokens), chunk):
            if cancelled is not None and cancelled():
                raise PromptCancelled
            piece = tokens[start : start + chunk]
            runner.sampler = sampler if start + chunk >= len(tokens) else greedy
            if len(piece) == 1:  # the one-token step plans the next step itself
                nxt, last = runner.feed(piece[0], prefill=True, prefetch=decode), None
            else:
                last = run_chunk(runner, piece, cancelled)
                nxt = last.next_token
    finally:
        runner.sampler = sampler
    if last is not None and decode:
        plan_next_step(runner.steps, last.pending)
    return nxt


def plan_next_step(steps: Steps, pending: dict[int, tuple[LayerStream, list[int]]]) -> None:
    """The last prompt token's predictions: the next step's plan and prefetch (as one-token)."""
    step = steps.step + 1
    for target, experts in pending.values():
        target.offer(step, experts)
        if steps.scheduler is not None:
            steps.scheduler.prefetch(target.layer, step, experts)
