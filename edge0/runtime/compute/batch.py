"""One batched decode step on the compute thread: B requests, one token each, one read per expert
(docs/runtime.md, "Batched decode": stacked rows or greenlets, per-row state).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import greenlet
import mlx.core as mx

from edge0.log import get_logger
from edge0.runtime.compute.batch_layer import batched_layer
from edge0.runtime.compute.rows import RowState
from edge0.runtime.compute.stack import Stack, stack_refusal
from edge0.runtime.compute.steps import Steps
from edge0.runtime.layers.block import StreamingMoE
from edge0.runtime.layers.streams import LayerStream, ResidentExperts

__all__ = ["BatchStep", "RowState", "export_state", "import_state", "prefetch_plans"]
log = get_logger("edge0.runtime.compute.batch")


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
    with steps.batched():
        for s in _streams(steps):
            if s.layer in union and not isinstance(s.experts, ResidentExperts):
                sched.prefetch(s.layer, steps.step + 1, list(union[s.layer]))


class BatchStep:
    """Runs one decode step of several rows: the step's executor while it runs."""

    def __init__(self, steps: Steps, model: Any) -> None:
        self.steps = steps
        self.model = model
        self.stack = Stack()
        self.stacked: bool | None = None  # rows run as one forward (decided at the first step)
        self._rows: list[RowState] | None = None  # the rows of a stacked forward under way

    def forward(self, block: StreamingMoE, x: mx.array) -> mx.array:
        """The batch's executor: the stacked forward's layer (x: (B, 1, d)) runs at once; a
        row's greenlet (x: (1, 1, d)) waits (switches out) until the batch ran it."""
        rows = self._rows
        if rows is not None:
            return self._stacked_layer(block, x, rows)
        parent = greenlet.getcurrent().parent
        assert parent is not None
        out: mx.array = parent.switch((block, x))
        return out

    def unstack(self) -> None:
        """Hand the stacked rows their own caches back (before one of them runs alone)."""
        self.stack.release()

    def run(self, rows: list[RowState], tokens: list[int]) -> list[int | None]:
        """Feed `tokens[i]` to `rows[i]`; the sampled next tokens (None: the row failed,
        its error in `row.error`)."""
        if self.stacked is None:
            why = stack_refusal(self.model)
            self.stacked = why is None
            if why is not None:
                log.debug("batch_greenlets", reason=why)
        steps = self.steps
        t0, c0 = time.perf_counter(), time.thread_time()
        steps.begin_step(prefill=False, prefetch=any(r.more for r in rows), executor=self)
        for row in rows:
            row.pos += 1
            row.cur, row.next = row.next, {}
        if self.stacked:
            results = self._run_stacked(rows, tokens)
        else:
            results = self._run_greenlets(rows, tokens)
        nxt = {r: r.runner.sampler(lg) for r, lg in results.items() if lg is not None}
        t1, c1 = time.perf_counter(), time.thread_time()
        mx.eval(list(nxt.values()))  # the step fence
        steps.span("eval", -1, t1, time.perf_counter(), time.thread_time() - c1)
        steps.cur.syncs += 1
        steps.cur.layers += rows[0].runner.uncounted * len(rows)
        steps.cur.cpu = time.thread_time() - c0
        steps.end_step(time.perf_counter() - t0)
        return [int(nxt[r].item()) if r in nxt else None for r in rows]  # type: ignore[arg-type]

    def _run_stacked(self, rows: list[RowState], tokens: list[int]) -> dict[RowState, Any]:
        """One (B, 1) forward over the rows' merged caches; each row's (1, vocab) logits."""
        caches = self.stack.hold(rows)
        self._rows = rows
        try:
            inputs = mx.array(tokens, dtype=mx.int32).reshape(len(rows), 1)
            logits = self.model(inputs, cache=caches)[:, -1, :]  # (B, vocab)
        except BaseException:
            self.stack.drop()  # a failed step: its rows end, their caches with them
            raise
        finally:
            self._rows = None
        return {r: logits[i : i + 1] if r.error is None else None for i, r in enumerate(rows)}

    def _stacked_layer(self, block: StreamingMoE, x: mx.array, rows: list[RowState]) -> mx.array:
        """A streaming layer of the stacked forward (x: (B, 1, d)). A row that failed at an
        earlier layer (its expert read) is left out and goes on with zeros, its logits dropped."""
        live = [i for i, r in enumerate(rows) if r.error is None]
        if len(live) == len(rows):
            return batched_layer(block, x, rows)
        out = mx.zeros_like(x)
        if live:
            at = mx.array(live)
            out[at] = batched_layer(block, x[at], [rows[i] for i in live])
        return out

    def _run_greenlets(self, rows: list[RowState], tokens: list[int]) -> dict[RowState, Any]:
        """Each row's forward as a greenlet over its own cache; each row's (1, vocab) logits."""
        results: dict[RowState, Any] = {}
        waiting: dict[RowState, tuple[Any, StreamingMoE, mx.array]] = {}
        try:
            for row, tok in zip(rows, tokens, strict=True):
                g = greenlet.greenlet(self._forward(row, tok))
                self._advance(row, g, (), waiting, results)
            while waiting:
                live = list(waiting)
                block = waiting[live[0]][1]
                assert all(waiting[r][1] is block for r in live), "rows out of step"
                xs = [waiting[r][2] for r in live]
                y = batched_layer(block, mx.concatenate(xs) if len(xs) > 1 else xs[0], live)
                for i, row in enumerate(live):
                    g = waiting.pop(row)[0]
                    if row.error is not None:  # the row failed at this layer: end its forward
                        g.throw(greenlet.GreenletExit)
                        results[row] = None
                    else:
                        self._advance(row, g, (y[i : i + 1],), waiting, results)
        finally:
            for g, _, _ in waiting.values():  # a failed step: end the rows still waiting
                g.throw(greenlet.GreenletExit)
        return results

    def _forward(self, row: RowState, tok: int) -> Any:
        runner = row.runner

        def forward() -> mx.array:
            return runner.model(mx.array([[tok]]), cache=runner.cache)[:, -1, :]  # (1, vocab)

        return forward

    def _advance(
        self,
        row: RowState,
        g: Any,
        args: tuple[Any, ...],
        waiting: dict[RowState, tuple[Any, StreamingMoE, mx.array]],
        results: dict[RowState, Any],
    ) -> None:
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
