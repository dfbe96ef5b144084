"""One streamed MoE layer for every row of a batched decode step: per-row routing, one read, one op.

`batched_layer` routes each row with its own router call and gate weights (one eval
for the batch), records each row's executed set and prediction (`RowState`, the union
of the predictions prefetched once), stages the union of the rows' sets once
(`Scheduler.acquire`: tickets deduplicated by the slot pool) and runs the experts'
FFN of all rows as one op with per-row slot indices. A failed expert read fails the
rows that needed that expert; the others go on.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from edge0.errors import TierReadError
from edge0.runtime.layers.block import expert_ffn
from edge0.runtime.layers.streams import ResidentExperts, RoutedStream

if TYPE_CHECKING:
    from edge0.runtime.compute.batch import RowState
    from edge0.runtime.layers.block import StreamingMoE


def batched_layer(block: StreamingMoE, xs: list[mx.array], rows: list[RowState]) -> list[Any]:
    """Layer `block` for every row: per-row routing, the union staged once, one gather_qmm.

    Returns each row's block output (1, 1, d), or None for a row whose expert read failed.
    """
    stream, fam = block.stream, block.family
    steps, layer, k = stream.steps, stream.layer, stream.top_k
    routed = isinstance(stream, RoutedStream)
    head = stream.head
    per: list[tuple[mx.array, mx.array, mx.array, list[int] | None, mx.array | None]] = []
    for x, row in zip(xs, rows, strict=True):
        scores = fam.scores(block, x)  # (1, 1, E): each row through its own router call
        true_inds, w = fam.select(block, scores, k)
        planned = row.cur.get(layer) if routed else None
        inds = true_inds
        if planned is not None:  # route mode: the row's prediction is its routing
            steps.routed_by_prediction += 1
            inds = mx.array(planned, dtype=mx.uint32).reshape(1, 1, len(planned))
            w = fam.weights(block, scores, inds)
        on = head is not None and row.more
        pred = head.graph(x, inds, row.prev_inds.get(layer), k) if on and head else None
        per.append((true_inds, inds, w, planned, pred))
    t0, c0 = time.perf_counter(), time.thread_time()
    mx.eval([a for p in per for a in (p[0], p[2], p[4]) if a is not None])  # one eval per layer
    steps.span("eval", layer, t0, time.perf_counter(), time.thread_time() - c0)
    steps.cur.syncs += 1
    steps.cur.layers += 1
    sets = _host_work(block, xs, rows, per)
    idx = _slots(block, rows, sets, per)
    alive = [i for i, row in enumerate(rows) if row.error is None]
    outs: list[Any] = [None] * len(rows)
    if not alive:
        return outs
    ins = [fam.expert_input(xs[i], per[i][2]) for i in alive]  # x (Llama-4: x * w)
    h = mx.expand_dims(mx.concatenate(ins, axis=0), (-2, -3))  # (B,1,1,1,d)
    rhs = mx.concatenate([idx[i] for i in alive], axis=0)  # (B, 1, K)
    y = expert_ffn(block, stream.views, h, rhs).squeeze(-2)  # (B, 1, K, d)
    for j, i in enumerate(alive):
        yi = fam.combine(y[j : j + 1], per[i][2])  # as the one-row block sums
        outs[i] = fam.extra(block, xs[i], yi)
    return outs


def _host_work(
    block: StreamingMoE, xs: list[mx.array], rows: list[RowState], per: list[Any]
) -> list[list[int]]:
    """After the readback: each row's executed set, its recorded routing, its prediction
    (prefetched as the union of the rows' predictions)."""
    stream = block.stream
    steps, layer, k, head = stream.steps, stream.layer, stream.top_k, stream.head
    sets: list[list[int]] = []
    union: dict[int, None] = {}
    for x, row, (true_inds, inds, _, planned, pred) in zip(xs, rows, per, strict=True):
        true: list[int] = true_inds.tolist()[0][0]
        experts = planned if planned is not None else true
        if steps.recording is not None:
            steps.recording[(row.pos, layer)] = list(true)
        prev = row.prev_experts.get(layer)
        row.prev_experts[layer], row.prev_inds[layer] = experts, inds
        sets.append(experts)
        if head is None or not row.more:
            continue
        got: list[int] | None
        if pred is not None:
            got = pred.tolist()
        else:
            got = head.predictor.predict(layer, row.pos, x, experts, true, prev, k)
        if got is not None:
            row.next[head.target.layer] = got
            union.update(dict.fromkeys(got))
    if union and head is not None and head.scheduler is not None:
        head.scheduler.prefetch(head.target.layer, steps.step + 1, list(union))
    return sets


def _slots(
    block: StreamingMoE, rows: list[RowState], sets: list[list[int]], per: list[Any]
) -> list[mx.array]:
    """Each row's (1, 1, K) index into the layer's views; the union is acquired once. A
    failed read fails the rows that needed that expert; the others go on."""
    stream = block.stream
    if isinstance(stream.experts, ResidentExperts):
        return [p[1] for p in per]
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
    return [
        mx.array([slot_of.get(e, 0) for e in sets[i]], dtype=mx.uint32).reshape(1, 1, -1)
        for i in range(len(rows))
    ]
