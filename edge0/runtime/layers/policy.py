"""Route policies: which experts a route-mode layer runs, from the prediction, the true scores and
what can be served without waiting (docs/runtime.md, "Route policies").
"""

from __future__ import annotations

import math
import time
from typing import Protocol

import mlx.core as mx

from edge0.log import get_logger
from edge0.routing.prerouter import PrerouterSet
from edge0.runtime.layers.clock import Clock
from edge0.runtime.layers.policy_graph import DeviceChoice, pool_slots

log = get_logger(__name__)
DEFAULT_DEADLINE_MS = 0.0  # compute never waits for a read the prediction did not start


class RoutedLayer(Protocol):
    """What a policy reads of the layer it chooses for (edge0.runtime.layers.streams)."""

    @property
    def layer(self) -> int: ...

    @property
    def prev_inds(self) -> mx.array | None: ...


def host_rank(true: list[int], scores: list[float]) -> list[int]:
    """Every expert, best first: the true top-K in the router's order, then by true score
    (ties by expert index). The choice is the first K of these that are servable."""
    head = set(true)
    return true + sorted((e for e in range(len(scores)) if e not in head), key=lambda e: -scores[e])


def in_graph(name: str, deadline_ms: float, grouped: bool) -> bool:
    """Whether the policy chooses on the device (no readback): available-first at deadline 0
    with deferred syncs (a wait for a true expert, or --sync-every 1, runs it on the host)."""
    return name == "available-first" and deadline_ms == 0 and grouped


def route_slots(
    name: str,
    deadline_ms: float | None,
    grouped: bool,
    base: int,
    k: int,
    n_experts: int,
    layers: int,
    record_size: int,
) -> int:
    """Slots of the pool: `base`, grown into a device-side cache for the in-graph choice."""
    deadline = DEFAULT_DEADLINE_MS if deadline_ms is None else deadline_ms
    if not in_graph(name, deadline, grouped):
        return base
    return pool_slots(base, k, n_experts, layers, record_size)


class RoutePolicy:
    """One engine's policy (not `predicted`): `choose` per routed layer-step on the host, or
    `device` (in the graph, `on_device`)."""

    def __init__(
        self,
        name: str,
        deadline_ms: float,
        steps: Clock,
        layer_heads: PrerouterSet | None = None,
    ) -> None:
        self.name = name
        self.deadline_s = deadline_ms / 1e3
        self.steps = steps
        self.layer_heads = heads = layer_heads if name == "deadline" else None
        self.ahead: dict[int, int] = dict(heads.target) if heads is not None else {}
        self.on_device = in_graph(name, deadline_ms, steps.groups is not None)
        self.device = DeviceChoice()

    @property
    def exact(self) -> bool:
        return math.isinf(self.deadline_s)

    def choose(
        self,
        stream: RoutedLayer,
        x: mx.array,
        scores: mx.array,
        true_inds: mx.array,
        planned: list[int],
    ) -> tuple[list[int], bool]:
        """The experts `stream`'s layer runs at this step, and whether they are the true
        top-K (then in the router's order: the caller keeps the router's indices and weights)."""
        steps, k = self.steps, len(planned)
        lead = self._lead_graph(stream, x, true_inds, k)
        t0, c0 = time.perf_counter(), time.thread_time()
        mx.eval([a for a in (scores, true_inds, lead) if a is not None])  # the policy's sync
        steps.span("eval", stream.layer, t0, time.perf_counter(), time.thread_time() - c0)
        steps.cur.syncs += 1
        true: list[int] = true_inds.tolist()[0][0]  # type: ignore[index,assignment]  # (1, 1, K)
        chosen = true if self.exact else self._select(stream.layer, true, scores, planned)
        steps.count_recall(chosen, true)
        if lead is not None:
            self._fetch_ahead(stream.layer, lead.tolist())  # type: ignore[arg-type]
        exact = set(chosen) == set(true)
        return (true if exact else chosen), exact

    def _select(
        self, layer: int, true: list[int], scores: mx.array, planned: list[int]
    ) -> list[int]:
        steps, k = self.steps, len(planned)
        sched = steps.scheduler
        assert sched is not None, "Steps.attach(scheduler) was not called"
        rank = host_rank(true, scores.reshape(-1).tolist())  # type: ignore[arg-type]  # (E,)
        # the predicted set was staged for this step (compute waits for it as `predicted`
        # does): never worse than the prediction, by true score
        now = sched.acquire(layer, steps.step, rank, servable=True) | set(planned)
        missing = [e for e in true if e not in now]
        if missing and self.deadline_s > 0:
            t0 = time.perf_counter()
            now |= sched.acquire(layer, steps.step, missing, within=self.deadline_s)
            steps.span("wait", layer, t0, time.perf_counter())
        chosen = [e for e in rank if e in now][:k]  # K of them: `planned` has K
        sched.prefetch(layer, steps.step, chosen, keep=True)  # slots held; RAM hits copied here
        return chosen

    def _lead_graph(
        self, stream: RoutedLayer, x: mx.array, true_inds: mx.array, k: int
    ) -> mx.array | None:
        """The same-token prediction of the next layer's experts (deadline policy), lazy."""
        heads, nxt = self.layer_heads, self.ahead.get(stream.layer)
        if heads is None or nxt is None or nxt not in self.steps.layers or self.exact:
            return None
        prev = stream.prev_inds
        return heads.predict_topk(
            stream.layer,
            x.reshape(-1),
            true_inds.reshape(-1),
            None if prev is None else prev.reshape(-1),
            k,
        )

    def _fetch_ahead(self, layer: int, predicted: list[int]) -> None:
        """Start reading the next layer's predicted experts that are not servable: one layer
        of lead time (used by `_select` there if they are in by then)."""
        sched, nxt = self.steps.scheduler, self.ahead[layer]
        assert sched is not None
        self.steps.cur.lead_reads += sched.prefetch(
            nxt, self.steps.step, predicted, unless_servable=True
        )


def layer_heads_for(model_dir: object, model: object) -> PrerouterSet:
    """The same-token heads of the deadline policy: trained (prerouter-layer.*) when the
    model directory has them (the demo ships them: edge0/data/teacher), else the
    training-free next-router rule (built from `model`, before its sparse blocks are
    replaced). Logs which."""
    from pathlib import Path

    if model_dir is not None and PrerouterSet.exists(Path(str(model_dir)), "layer"):
        heads = PrerouterSet.load(Path(str(model_dir)), "layer")
        heads.check_model(model)  # type: ignore[arg-type]
        log.info("route_policy.layer_heads", heads="trained", model=str(model_dir))
        return heads
    log.info("route_policy.layer_heads", heads="next-router rule", model=str(model_dir))
    return PrerouterSet.from_model(model, wrap=False, lean=True, horizon="layer")  # type: ignore[arg-type]
