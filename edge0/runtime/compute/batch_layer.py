"""One streamed MoE layer for every row of a batched decode step: per-row routing, one read, one op
(docs/runtime.md, "Batched decode", the batched layer).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import mlx.core as mx

from edge0.errors import TierReadError
from edge0.runtime.compute.rows import RowState
from edge0.runtime.layers.block import StreamingMoE, expert_ffn
from edge0.runtime.layers.streams import ResidentExperts, RoutedStream, SlotExperts


def batched_layer(block: StreamingMoE, x: mx.array, rows: list[RowState]) -> mx.array:
    """Layer `block` for the rows stacked in `x` (B, 1, d): per-row routing over one router
    call, the union staged once, one expert op. Returns the block output (B, 1, d); a row
    whose expert read failed has its `error` set and a zero output row."""
    stream, fam = block.stream, block.family
    steps, layer, k = stream.steps, stream.layer, stream.top_k
    head = stream.head
    scores = fam.scores(block, x)  # (B, 1, E)
    true_inds, w = fam.select(block, scores, k)  # (B, 1, K) each
    plans = [r.cur.get(layer) for r in rows] if isinstance(stream, RoutedStream) else []
    planned = [p is not None for p in plans]
    inds = true_inds
    if any(planned):  # route mode: a row's prediction is its routing
        steps.routed_by_prediction += sum(planned)
        given = mx.array([p if p is not None else [0] * k for p in plans], dtype=mx.uint32)
        given = given.reshape(len(rows), 1, -1)
        w_given = fam.weights(block, scores, given)
        if all(planned):
            inds, w = given, w_given
        else:  # rows without a plan keep the router's own indices and weights
            on = mx.array(planned).reshape(-1, 1, 1)
            inds, w = mx.where(on, given, true_inds), mx.where(on, w_given, w)
    stacked = _stacked_predictions(block, x, inds, rows)  # (B, k), or None: row by row
    preds: list[mx.array | None] = [None] * len(rows)
    if head is not None and stacked is None:
        for i, row in enumerate(rows):
            if row.more:
                preds[i] = head.graph(x[i : i + 1], inds[i : i + 1], row.prev_inds.get(layer), k)
    t0, c0 = time.perf_counter(), time.thread_time()
    mx.eval(true_inds, w, stacked, [p for p in preds if p is not None])  # one eval per layer
    steps.span("eval", layer, t0, time.perf_counter(), time.thread_time() - c0)
    steps.cur.syncs += 1
    steps.cur.layers += 1
    trues: list[list[int]] = [r[0] for r in true_inds.tolist()]
    got: list[Any] = [p.tolist() if p is not None else None for p in preds]  # (k,) lists
    if stacked is not None:
        lists: list[Any] = stacked.tolist()  # type: ignore[assignment]
        got = [g if r.more else None for g, r in zip(lists, rows, strict=True)]
    sets = [p if p is not None else t for p, t in zip(plans or trues, trues, strict=True)]
    ahead = _host_work(block, x, rows, trues, sets, inds, got)
    h = fam.expert_input(x, w)  # (B, 1, d), or (B, 1, K, d): an input per expert
    with steps.demand_first():
        if ahead and head is not None and head.scheduler is not None:  # read after the union
            head.scheduler.prefetch(head.target.layer, steps.step + 1, ahead)
        staged = _stage(block, rows, sets) if h.ndim == 3 else None  # the union's reads issued
    y = _arriving(block, h, rows, sets, *staged) if staged is not None else None
    if y is None:  # in one piece (or again, without the rows a failed read ended)
        idx = _slots(block, rows, sets, inds)
        y = expert_ffn(block, stream.views, mx.expand_dims(h, (-2, -3)), idx).squeeze(-2)
    out = fam.extra(block, x, fam.combine(y, w))  # (B, 1, d), as one row sums
    failed = [r.error is not None for r in rows]
    if any(failed):
        out = mx.where(mx.array(failed).reshape(-1, 1, 1), mx.zeros_like(out), out)
    return out


def _stacked_predictions(
    block: StreamingMoE, x: mx.array, inds: mx.array, rows: list[RowState]
) -> mx.array | None:
    """The rows' predictions (B, k) from one call of the prediction head over the stack (a
    head's layers are row-wise: a row gets the prediction it gets alone); None where the
    predictor has no graph, no row uses one, or a row has no previous set the head reads."""
    head = block.stream.head
    rows_fn = getattr(head.predictor, "rows", None) if head is not None else None
    if head is None or rows_fn is None or not any(r.more for r in rows):
        return None
    layer, k, b = block.stream.layer, block.stream.top_k, len(rows)
    prevs = [p for r in rows if (p := r.prev_inds.get(layer)) is not None]
    if getattr(head.predictor, "hidden_only", False):
        prev = inds  # not read by the lean heads
    elif len(prevs) == b:
        prev = mx.concatenate(prevs) if b > 1 else prevs[0]
    else:
        return None
    head.on_host = False
    got: mx.array = rows_fn(layer, x.reshape(b, -1), inds.reshape(b, -1), prev.reshape(b, -1), k)
    return got


def _host_work(
    block: StreamingMoE,
    x: mx.array,
    rows: list[RowState],
    trues: list[list[int]],
    sets: list[list[int]],
    inds: mx.array,
    preds: list[list[int] | None],
) -> list[int]:
    """After the readback: each row's recorded routing, its executed set and indices, its
    prediction; returns the union of the rows' predictions (the caller prefetches it)."""
    stream = block.stream
    steps, layer, k, head = stream.steps, stream.layer, stream.top_k, stream.head
    union: dict[int, None] = {}
    for i, (row, true, experts, pred) in enumerate(zip(rows, trues, sets, preds, strict=True)):
        if steps.recording is not None:
            steps.recording[(row.pos, layer)] = list(true)
        prev = row.prev_experts.get(layer)
        row.prev_experts[layer], row.prev_inds[layer] = experts, inds[i : i + 1]
        if head is None or not row.more:
            continue
        got = pred
        if got is None:  # a host predictor (oracle, temporal)
            got = head.predictor.predict(layer, row.pos, x[i : i + 1], experts, true, prev, k)
        if got is not None:
            row.next[head.target.layer] = got
            union.update(dict.fromkeys(got))
    return list(union)


def _stage(
    block: StreamingMoE, rows: list[RowState], sets: list[list[int]]
) -> tuple[list[int], Iterator[list[tuple[int, int]]]] | None:
    """The union of the rows' sets and its slots in groups as their reads complete (the
    reads issued now: edge0.runtime.layers.streams.SlotExperts.arrivals); None where the
    layer takes its slots in one piece."""
    stream = block.stream
    if not stream.overlaps() or any(r.error is not None for r in rows):
        return None
    assert isinstance(stream.experts, SlotExperts)
    union = list(dict.fromkeys(e for s in sets for e in s))
    return union, stream.experts.arrivals(union)


def _arriving(
    block: StreamingMoE,
    h: mx.array,
    rows: list[RowState],
    sets: list[list[int]],
    union: list[int],
    groups: Iterator[list[tuple[int, int]]],
) -> mx.array | None:
    """The rows' expert outputs (B, 1, K, d), the (row, expert) pairs of each group computed
    as its slots become ready (the first, when more follow, launched and computing while
    the rest are read), put back in the rows' routing order: each pair's output is the one
    op's. None when a read failed (its rows are ended; the others are computed in one
    piece by the caller)."""
    stream = block.stream
    steps, layer = stream.steps, stream.layer
    b, k, d = len(rows), len(sets[0]), h.shape[-1]
    pairs: dict[int, list[int]] = {}  # expert -> its pairs, row * K + position
    for i, s in enumerate(sets):
        for j, e in enumerate(s):
            pairs.setdefault(e, []).append(i * k + j)
    flat = h.reshape(b, d)
    ys: list[mx.array] = []
    order: list[int] = []
    try:
        for group in groups:
            got = [(p, slot) for at, slot in group for p in pairs[union[at]]]
            n = len(got)
            hx = flat[mx.array([p // k for p, _ in got], dtype=mx.uint32)].reshape(n, 1, 1, 1, d)
            idx = mx.array([slot for _, slot in got], dtype=mx.uint32).reshape(n, 1, 1)
            y = expert_ffn(block, stream.views, hx, idx)  # (n, 1, 1, 1, d)
            ys.append(y)
            order += [p for p, _ in got]
            if len(order) < b * k:  # more to come: these pairs compute while they are read
                t0 = time.perf_counter()
                mx.async_eval(y)
                steps.span("partial", layer, t0, time.perf_counter())
    except TierReadError as exc:
        bad = [i for i, s in enumerate(sets) if exc.layer == layer and exc.expert in s]
        if not bad:
            raise
        for i in bad:
            rows[i].error = exc
        steps.forget_failures()  # the others may read this expert again later
        return None
    y = mx.concatenate(ys) if len(ys) > 1 else ys[0]  # (B * K, 1, 1, 1, d), arrival order
    if order != list(range(b * k)):
        back = sorted(range(b * k), key=order.__getitem__)
        y = mx.take(y, mx.array(back, dtype=mx.uint32), axis=0)
    return y.reshape(b, 1, k, d)


def _slots(
    block: StreamingMoE, rows: list[RowState], sets: list[list[int]], inds: mx.array
) -> mx.array:
    """The rows' (B, 1, K) index into the layer's views; the union is acquired once. A failed
    read fails the rows that needed that expert (their index: slot 0); the others go on."""
    stream = block.stream
    if isinstance(stream.experts, ResidentExperts):
        return inds
    steps, layer = stream.steps, stream.layer
    sched = steps.scheduler
    assert sched is not None
    t0, c0 = time.perf_counter(), time.thread_time()
    while True:
        live = [i for i, r in enumerate(rows) if r.error is None]
        union = list(dict.fromkeys(e for i in live for e in sets[i]))
        try:
            slots = sched.acquire(layer, steps.step, union, fenced=True) if union else []
            break
        except TierReadError as exc:
            bad = [i for i in live if exc.layer == layer and exc.expert in sets[i]]
            if not bad:
                raise
            for i in bad:
                rows[i].error = exc
            steps.forget_failures()  # the others may read this expert again later
    steps.span("wait", layer, t0, time.perf_counter(), time.thread_time() - c0)
    slot_of = dict(zip(union, slots, strict=True))
    table = [[slot_of.get(e, 0) for e in s] for s in sets]
    return mx.array(table, dtype=mx.uint32).reshape(len(rows), 1, -1)
