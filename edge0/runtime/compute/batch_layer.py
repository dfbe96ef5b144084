"""One streamed MoE layer for every row of a batched decode step: per-row routing, one read, one op
(docs/runtime.md, "Batched decode", the batched layer).
"""

from __future__ import annotations

import time
from typing import Any

import mlx.core as mx

from edge0.errors import TierReadError
from edge0.runtime.compute.rows import RowState
from edge0.runtime.layers.block import StreamingMoE, expert_ffn
from edge0.runtime.layers.streams import ResidentExperts, RoutedStream


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
    _host_work(block, x, rows, trues, sets, inds, got)
    idx = _slots(block, rows, sets, inds)
    y = expert_ffn(block, stream.views, mx.expand_dims(fam.expert_input(x, w), (-2, -3)), idx)
    out = fam.extra(block, x, fam.combine(y.squeeze(-2), w))  # (B, 1, d), as one row sums
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
) -> None:
    """After the readback: each row's recorded routing, its executed set and indices, its
    prediction (prefetched as the union of the rows' predictions)."""
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
    if union and head is not None and head.scheduler is not None:
        head.scheduler.prefetch(head.target.layer, steps.step + 1, list(union))


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
            sched.forget_failures()  # the others may read this expert again later
    steps.span("wait", layer, t0, time.perf_counter(), time.thread_time() - c0)
    slot_of = dict(zip(union, slots, strict=True))
    table = [[slot_of.get(e, 0) for e in s] for s in sets]
    return mx.array(table, dtype=mx.uint32).reshape(len(rows), 1, -1)
