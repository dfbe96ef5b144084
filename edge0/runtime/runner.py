"""The compute-thread side of a run: per-step state for the streaming blocks; one request's steps.

`StreamContext` is shared by every `StreamingMoE` block of a model: the mode,
the routing capacity, the predictions made one step ahead, the scheduler, and
per-step timing. `Runner` feeds one request's tokens through the model one step
at a time (prompt tokens included, so every step has the same one-token shape).
Everything here runs on the compute thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from edge0.model.sparse import sparse_blocks
from edge0.routing.predictors import Predictor
from edge0.runtime.scheduler import Scheduler
from edge0.runtime.slotmem import SlotMemory
from edge0.runtime.trace import Tracer

if TYPE_CHECKING:
    from edge0.runtime.prefill import ChunkState

MODES = ("resident", "reactive", "hint", "route")


@attrs.define
class StepRecord:
    """Timing of one step on the compute thread (seconds)."""

    step: int
    prefill: bool
    wall: float = 0.0
    eval: float = 0.0  # in mx.eval (MLX compute)
    wait: float = 0.0  # blocked on reads
    predict: float = 0.0  # predictor graphs (MLX compute, included in `eval` too)
    layers: int = 0  # streamed layers run
    cpu: float = 0.0  # CPU time of the compute thread over the step (time.thread_time)
    cpu_excluded: float = 0.0  # ... of it inside mx.eval and waiting on reads


class StreamContext:
    """State shared by the streaming blocks of one model."""

    def __init__(
        self,
        mode: str,
        top_k: int,
        tracer: Tracer,
        scheduler: Scheduler | None = None,
        memory: SlotMemory | None = None,
        quant: dict[str, Any] | None = None,
        predictor: Predictor | None = None,
    ) -> None:
        self.mode = mode
        self.top_k = top_k
        self.tracer = tracer
        self.scheduler = scheduler
        self.memory: Any = memory
        self.quant = quant or {}
        self.predictor = predictor
        self.step = -1  # global step counter (fences use it)
        self.pos = -1  # position within the current request
        self.prefill = False
        self.request = 0
        # (layer, step) -> (step, experts): what the predictor said `layer` runs at `step`
        self.predictions: dict[tuple[int, int], tuple[int, list[int]]] = {}
        self.routed_by_prediction = 0  # layer-steps whose routing was the prediction
        self.prev_executed: dict[int, list[int]] = {}
        self.prev_inds: dict[int, mx.array] = {}
        self.recording: dict[tuple[int, int], list[int]] | None = None
        # layers whose experts stay in memory (first-layer policy "resident"): field -> (E, ...)
        self.resident_experts: dict[int, dict[str, mx.array]] = {}
        self.records: list[StepRecord] = []
        self.cur = StepRecord(-1, True)
        self.prefill_chunk = 1  # prompt tokens per forward (edge0.runtime.prefill)
        self.chunk: ChunkState | None = None  # the prompt chunk being computed

    # --- request and step boundaries ----------------------------------------------------
    def begin_request(self, request: int) -> None:
        self.request, self.pos = request, -1
        self.predictions.clear()
        self.prev_executed.clear()
        self.prev_inds.clear()
        if self.scheduler is not None:
            self.scheduler.begin_request(request)

    def begin_step(self, prefill: bool) -> None:
        self.step += 1
        self.pos += 1
        self.prefill = prefill
        self.cur = StepRecord(self.step, prefill)
        for key in [k for k in self.predictions if k[1] < self.step]:
            del self.predictions[key]
        if self.scheduler is not None:
            self.scheduler.begin_step(self.step)

    def end_step(self, wall: float) -> None:
        self.cur.wall = wall
        self.records.append(self.cur)

    # --- called by the streaming blocks ----------------------------------------------------
    def span(self, kind: str, layer: int, start: float, end: float, cpu: float = 0.0) -> None:
        """Account a compute-thread span; `cpu` is its thread CPU time (eval and wait)."""
        self.cur.cpu_excluded += cpu
        if kind == "eval":
            self.cur.eval += end - start
        elif kind == "predict":
            self.cur.predict += end - start
            self.cur.eval += end - start
        elif kind == "wait":
            self.cur.wait += end - start
        self.tracer.compute(kind, self.step, layer, start, end)

    def planned(self, layer: int) -> list[int] | None:
        """The expert set of `layer` predicted for this step, when it is the routing."""
        if self.mode != "route" or self.prefill:
            return None
        got = self.predictions.get((layer, self.step))
        if got is None:
            return None
        self.routed_by_prediction += 1
        return got[1]

    def prediction_graph(self, layer: int, x: mx.array, executed: mx.array) -> mx.array | None:
        """The lazy prediction of the head owned by `layer`, evaluated with its routing."""
        pred = self.predictor
        if pred is None or self.mode in ("resident", "reactive") or layer not in pred.targets:
            return None
        return pred.graph(layer, x, executed, self.prev_inds.get(layer), self.top_k)

    def after_routing(
        self, layer: int, x: mx.array, executed: list[int], true: list[int],
        executed_mx: mx.array, pred_graph: mx.array | None,
    ) -> None:  # fmt: skip
        """Record routing; issue the prefetch of what the predictor owned by `layer` said."""
        self.cur.layers += 1
        if self.recording is not None:
            self.recording[(self.pos, layer)] = list(true)
        prev = self.prev_executed.get(layer)
        self.prev_executed[layer] = executed
        self.prev_inds[layer] = executed_mx
        pred = self.predictor
        if pred is None or self.mode in ("resident", "reactive") or layer not in pred.targets:
            return
        if pred_graph is not None:
            experts: list[int] | None = pred_graph.tolist()  # type: ignore[assignment]
        else:
            t0 = time.perf_counter()
            experts = pred.predict(layer, self.pos, x, executed, true, prev, self.top_k)
            self.span("predict", layer, t0, time.perf_counter())
        if experts is None:
            return
        target = pred.targets[layer]
        self.predictions[(target, self.step + 1)] = (self.step + 1, experts)
        assert self.scheduler is not None
        self.scheduler.prefetch(target, self.step + 1, experts)

    def acquire(self, layer: int, experts: list[int]) -> list[int]:
        assert self.scheduler is not None
        t0, c0 = time.perf_counter(), time.thread_time()
        slots = self.scheduler.acquire(layer, self.step, experts)
        self.span("wait", layer, t0, time.perf_counter(), time.thread_time() - c0)
        return slots


Sampler = Callable[[mx.array], mx.array]


def greedy(logits: mx.array) -> mx.array:
    return mx.argmax(logits, axis=-1)


class Runner:
    """One request: a fresh KV cache, tokens fed one step at a time."""

    def __init__(self, model: nn.Module, ctx: StreamContext, request: int, sampler: Sampler):
        self.model = model
        self.ctx = ctx
        self.sampler = sampler
        self.cache = make_prompt_cache(model)
        self.n_layers = len(sparse_blocks(model))
        ctx.begin_request(request)

    def feed(self, token: int, prefill: bool) -> int:
        """Run one step on `token`; return the sampled next token."""
        ctx = self.ctx
        t0, c0 = time.perf_counter(), time.thread_time()
        ctx.begin_step(prefill)
        logits = self.model(mx.array([[token]]), cache=self.cache)[:, -1, :]  # (1, vocab)
        nxt = self.sampler(logits)
        t1, c1 = time.perf_counter(), time.thread_time()
        mx.eval(nxt)  # the step fence: every graph of this step is evaluated
        t2, c2 = time.perf_counter(), time.thread_time()
        ctx.span("eval", -1, t1, t2, c2 - c1)
        ctx.cur.cpu = c2 - c0
        if ctx.mode == "resident":  # no streaming blocks count layers: count them here
            ctx.cur.layers = self.n_layers
        ctx.end_step(t2 - t0)
        return int(nxt.item())  # type: ignore[arg-type]

    def prefill(self, tokens: list[int]) -> int:
        """Feed the prompt; return the first generated token."""
        if self.ctx.prefill_chunk > 1 and len(tokens) > 1:
            from edge0.runtime.prefill import chunked_prefill

            return chunked_prefill(self, tokens, self.ctx.prefill_chunk)
        nxt = -1
        for tok in tokens:
            nxt = self.feed(tok, prefill=True)
        return nxt
