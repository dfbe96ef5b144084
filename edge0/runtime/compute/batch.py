"""One batched decode step on the compute thread: B requests, one token each, one read per expert.

Each request keeps its own KV cache (mlx-lm's `make_prompt_cache`, exactly as a
request decoded alone) and runs its own forward; only the streamed MoE blocks are
shared. The B forwards run as greenlets on the compute thread (MLX streams are
thread-affine: no other thread may build graphs): each runs until its next
streaming block, where it hands its hidden state over and waits; when all rows
stand at the same layer, `batched_layer` routes every row (its own router and
gate weights, one eval for the whole batch), stages the union of the rows' expert
sets once (`Scheduler.acquire`: tickets deduplicated by the slot pool), runs one
`gather_qmm` with per-row slot indices, and hands each row its output.

Per-row state (`RowState`) replaces what a `LayerStream` keeps for one request:
the sets planned for the row's next step (route: the routing; hint: prefetch
only), the executed set and indices of its previous step (predictor inputs), its
position. `export_state` / `import_state` move a request between this and the
streams' own state, so a request that is alone again decodes on the one-request
path (edge0.runtime.compute.runner) unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import attrs
import greenlet
import mlx.core as mx

from edge0.errors import TierReadError
from edge0.runtime.compute.runner import Runner
from edge0.runtime.layers.block import expert_ffn
from edge0.runtime.layers.streams import LayerStream, ResidentExperts, RoutedStream

if TYPE_CHECKING:
    from edge0.runtime.compute.steps import Steps
    from edge0.runtime.layers.block import StreamingMoE


@attrs.define(eq=False)
class RowState:
    """One request of a batch: its runner (cache, sampler) and its per-layer stream state."""

    runner: Runner
    request: int
    pos: int = -1  # position of the token fed last
    more: bool = True  # a step follows this one: its predictions are used
    cur: dict[int, list[int]] = attrs.field(factory=dict)  # layer -> set planned for this step
    next: dict[int, list[int]] = attrs.field(factory=dict)  # layer -> set for the next step
    prev_experts: dict[int, list[int] | None] = attrs.field(factory=dict)
    prev_inds: dict[int, mx.array | None] = attrs.field(factory=dict)
    error: BaseException | None = None


def _streams(steps: Steps) -> Iterable[LayerStream]:
    return (s for s in steps.layers.values() if isinstance(s, LayerStream))


def export_state(steps: Steps, row: RowState) -> None:
    """The streams hold `row`'s state (it ran alone): copy it into `row`."""
    nxt = steps.step + 1
    row.pos, row.next = steps.pos, {}
    for s in _streams(steps):
        plan = s.plans[nxt & 1]
        if plan is not None and plan[0] == nxt:
            row.next[s.layer] = plan[1]
        row.prev_experts[s.layer], row.prev_inds[s.layer] = s.prev_experts, s.prev_inds


def import_state(steps: Steps, row: RowState) -> None:
    """`row` runs alone from the next step: give the streams its state, prefetch its plans."""
    nxt = steps.step + 1
    steps.pos, steps.request = row.pos, row.request
    sched = steps.scheduler
    for s in _streams(steps):
        s.reset()
        s.prev_experts, s.prev_inds = row.prev_experts.get(s.layer), row.prev_inds.get(s.layer)
        experts = row.next.get(s.layer)
        if experts is not None:
            s.offer(nxt, experts)
            if sched is not None and not isinstance(s.experts, ResidentExperts):
                sched.prefetch(s.layer, nxt, experts)


def prefetch_plans(steps: Steps, rows: list[RowState]) -> None:
    """Stage the rows' planned sets for the next step (after a prompt or a pause moved slots)."""
    sched = steps.scheduler
    if sched is None:
        return
    union: dict[int, dict[int, None]] = {}
    for row in rows:
        for layer, experts in row.next.items():
            union.setdefault(layer, {}).update(dict.fromkeys(experts))
    with sched.batched():
        for s in _streams(steps):
            if s.layer in union and not isinstance(s.experts, ResidentExperts):
                sched.prefetch(s.layer, steps.step + 1, list(union[s.layer]))


class BatchStep:
    """Runs one decode step of several rows; `steps.batch` points here while it runs."""

    def __init__(self, steps: Steps, model: Any) -> None:
        self.steps = steps
        self.model = model
        self._rows: dict[Any, RowState] = {}  # greenlet -> row

    def join(self, block: StreamingMoE, x: mx.array) -> mx.array:
        """Called by a row's streaming block: wait (switch out) until the batch ran the layer."""
        parent = greenlet.getcurrent().parent
        assert parent is not None
        out: mx.array = parent.switch((block, x))
        return out

    def run(self, rows: list[RowState], tokens: list[int]) -> list[int | None]:
        """Feed `tokens[i]` to `rows[i]`; the sampled next tokens (None: the row failed,
        its error in `row.error`)."""
        steps = self.steps
        t0, c0 = time.perf_counter(), time.thread_time()
        steps.begin_step(prefill=False, prefetch=any(r.more for r in rows))
        for row in rows:
            row.pos += 1
            row.cur, row.next = row.next, {}
        results: dict[RowState, Any] = {}
        waiting: dict[RowState, tuple[Any, StreamingMoE, mx.array]] = {}
        steps.batch = self
        try:
            for row, tok in zip(rows, tokens, strict=True):
                g = greenlet.greenlet(self._forward(row, tok))
                self._advance(row, g, (), waiting, results)
            while waiting:
                live = list(waiting)
                block = waiting[live[0]][1]
                assert all(waiting[r][1] is block for r in live), "rows out of step"
                outs = batched_layer(block, [waiting[r][2] for r in live], live)
                for row, y in zip(live, outs, strict=True):
                    g = waiting.pop(row)[0]
                    if y is None:  # the row failed at this layer: end its forward
                        g.throw(greenlet.GreenletExit)
                        results[row] = None
                    else:
                        self._advance(row, g, (y,), waiting, results)
        finally:
            steps.batch = None
            for g, _, _ in waiting.values():  # a failed step: end the rows still waiting
                g.throw(greenlet.GreenletExit)
        nxt = {r: r.runner.sampler(lg) for r, lg in results.items() if lg is not None}
        t1, c1 = time.perf_counter(), time.thread_time()
        mx.eval(list(nxt.values()))  # the step fence
        steps.span("eval", -1, t1, time.perf_counter(), time.thread_time() - c1)
        steps.cur.syncs += 1
        steps.cur.layers += rows[0].runner.uncounted * len(rows)
        steps.cur.cpu = time.thread_time() - c0
        steps.end_step(time.perf_counter() - t0)
        return [int(nxt[r].item()) if r in nxt else None for r in rows]  # type: ignore[arg-type]

    def _forward(self, row: RowState, tok: int) -> Any:
        runner = row.runner

        def forward() -> mx.array:
            return runner.model(mx.array([[tok]]), cache=runner.cache)[:, -1, :]  # (1, vocab)

        return forward

    def _advance(
        self, row: RowState, g: Any, args: tuple[Any, ...],
        waiting: dict[RowState, tuple[Any, StreamingMoE, mx.array]], results: dict[RowState, Any],
    ) -> None:  # fmt: skip
        """Run row `g` to its next streaming block (or to its logits, or its error)."""
        try:
            got = g.switch(*args)
        except Exception as exc:  # noqa: BLE001 - this row's failure, not the batch's
            row.error, results[row] = exc, None
            return
        if g.dead:
            results[row] = got
        else:
            waiting[row] = (g, got[0], got[1])


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
