"""Predictors of the next step's experts: oracle, temporal, init (untrained heads) and heads
(docs/runtime.md, "Predictors").
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from edge0.errors import ConfigError
from edge0.log import get_logger
from edge0.options.engine import PREDICTORS
from edge0.routing.prerouter import PrerouterSet, RouterCopyHead

log = get_logger("edge0.routing.predictors")

# a one-token step's head runs compiled (tests compare the predictions with this off)
COMPILED = True

# the host lists `executed` and `prev` were made from, when known (`prev` None: no previous
# step): a head then takes its multi-hot inputs as one constant instead of building them
HostSets = tuple[list[int], list[int] | None] | None


class Predictor(Protocol):
    """`graph` (lazy, evaluated together with the layer's routing) or `predict` (after it)."""

    name: str
    targets: dict[int, int]  # owner layer -> target layer (predicted for the next step)

    def graph(
        self,
        layer: int,
        x: mx.array,
        executed: mx.array,
        prev: mx.array | None,
        k: int,
        ranked: bool = False,
        sets: HostSets = None,
    ) -> mx.array | None: ...

    def predict(
        self,
        layer: int,
        pos: int,
        x: mx.array,
        executed: list[int],
        true: list[int],
        prev: list[int] | None,
        k: int,
    ) -> list[int] | None: ...


def chain(layers: list[int], wrap: bool) -> dict[int, int]:
    """Owner -> target: each streamed layer predicts the next; the last the first when `wrap`."""
    targets = {a: b for a, b in zip(layers, layers[1:], strict=False)}
    if wrap and layers:
        targets[layers[-1]] = layers[0]
    return targets


class _HostOnly:
    """Predictors that decide on the host from routing already known: no MLX graph (their
    sets come in router order, best first)."""

    def graph(
        self,
        layer: int,
        x: mx.array,
        executed: mx.array,
        prev: mx.array | None,
        k: int,
        ranked: bool = False,
        sets: HostSets = None,
    ) -> mx.array | None:
        return None


class OraclePredictor(_HostOnly):
    """Replays recorded true routing: `recording[(pos, layer)]` = experts in router order."""

    name = "oracle"

    def __init__(self, recording: dict[tuple[int, int], list[int]], layers: list[int]) -> None:
        self.recording = recording
        self.targets = chain(layers, wrap=True)

    def predict(
        self,
        layer: int,
        pos: int,
        x: mx.array,
        executed: list[int],
        true: list[int],
        prev: list[int] | None,
        k: int,
    ) -> list[int] | None:
        got = self.recording.get((pos + 1, self.targets[layer]))
        return None if got is None else got[:k]


class TemporalPredictor(_HostOnly):
    """The experts a layer's router chose for the last token (same layer, next step)."""

    name = "temporal"

    def __init__(self, layers: list[int]) -> None:
        self.targets = {layer: layer for layer in layers}

    def predict(
        self,
        layer: int,
        pos: int,
        x: mx.array,
        executed: list[int],
        true: list[int],
        prev: list[int] | None,
        k: int,
    ) -> list[int] | None:
        return true[:k]


class HeadPredictor:
    """Prerouter heads: trained (`heads`) or untrained = next layer's router (`init`)."""

    def __init__(self, heads: PrerouterSet, name: str) -> None:
        self.heads = heads
        self.name = name
        self.targets = dict(heads.target)
        self.hidden_only = all(isinstance(h, RouterCopyHead) for h in heads.heads.values())
        # (layer, k) -> the head and its top-k compiled (one-token steps, host multi-hots)
        self._compiled: dict[tuple[int, int], Callable[..., mx.array]] = {}

    def graph(
        self,
        layer: int,
        x: mx.array,
        executed: mx.array,
        prev: mx.array | None,
        k: int,
        ranked: bool = False,
        sets: HostSets = None,
    ) -> mx.array | None:
        """(k,) predicted experts of the target layer at t+1, lazy (x: (1, 1, d)); `ranked`:
        best first (else in no order); `sets`: the host lists of `executed` and `prev`."""
        one_token = x.size == x.shape[-1]
        if COMPILED and not ranked and one_token and (self.hidden_only or sets is not None):
            hots = None if self.hidden_only or sets is None else host_hots(self.heads, sets)
            return self.compiled(layer, k)(x, hots)
        if self.hidden_only:  # untrained lean heads: the sets are not inputs
            logits = self.heads.predict(layer, x.reshape(-1), None, None)  # (E,)
        elif sets is not None:  # the multi-hot inputs from the host: no nodes to build them
            logits = self.heads.predict_hots(layer, x.reshape(-1), host_hots(self.heads, sets))
        else:
            prev_flat = None if prev is None else prev.reshape(-1)
            logits = self.heads.predict(layer, x.reshape(-1), executed.reshape(-1), prev_flat)
        if ranked:  # best first: one sort of the E logits (fewer nodes than sorting the k)
            return mx.argsort(-logits, axis=-1)[:k]
        return mx.argpartition(-logits, kth=k - 1, axis=-1)[:k]

    def compiled(self, layer: int, k: int) -> Callable[..., mx.array]:
        """One token's (k,) prediction, compiled: the head's logits then the top-k, the same
        ops as `graph`'s, its element-wise tail (the adds, the negation) one node and the
        Python that builds them run once. The head's parameters are the compiled function's
        implicit inputs (`inputs=`), so replaced weights are read, not stale constants."""
        fn = self._compiled.get((layer, k))
        if fn is None:
            heads = self.heads

            def topk(x: mx.array, hots: mx.array | None) -> mx.array:
                if hots is None:
                    logits = heads.predict(layer, x.reshape(-1), None, None)
                else:
                    logits = heads.predict_hots(layer, x.reshape(-1), hots)
                return mx.argpartition(-logits, kth=k - 1, axis=-1)[:k]

            head = heads.heads.get(layer)  # (none: `predict` raises, naming the heads)
            fn = mx.compile(topk, inputs=head.state if head is not None else {})
            self._compiled[(layer, k)] = fn
        return fn

    def rows(self, layer: int, x: mx.array, executed: mx.array, prev: mx.array, k: int) -> mx.array:
        """(T, k) predicted experts of the target layer, lazy, one row per token t of a prompt
        chunk: each row the target's set at t+1 (x: (T, d); executed, prev: (T, K) at t, t-1)."""
        lean = self.hidden_only  # untrained lean heads: the sets are not inputs
        return self.heads.predict_topk(
            layer, x, None if lean else executed, None if lean else prev, k
        )

    def predict(
        self,
        layer: int,
        pos: int,
        x: mx.array,
        executed: list[int],
        true: list[int],
        prev: list[int] | None,
        k: int,
    ) -> list[int] | None:
        top = self.graph(layer, x, mx.array(executed), None if prev is None else mx.array(prev), k)
        assert top is not None
        out: list[int] = top.tolist()  # type: ignore[assignment]
        return out


def host_hots(heads: PrerouterSet, sets: tuple[list[int], list[int] | None]) -> mx.array:
    """(2E,) float32 [multi-hot(executed), multi-hot(prev)]: `multi_hot` of both, concatenated,
    the same values, built on the host (an evaluated constant: no graph nodes)."""
    e = heads.config.num_experts
    hots = np.zeros(2 * e, dtype=np.float32)
    hots[sets[0]] = 1.0
    if sets[1] is not None:
        hots[[e + i for i in sets[1]]] = 1.0
    return mx.array(hots)


def make_predictor(
    name: str,
    model: nn.Module,
    layers: list[int],
    model_dir: Path | None = None,
    wrap: bool = True,
    recording: dict[tuple[int, int], list[int]] | None = None,
) -> Predictor:
    """Build a predictor before the model's sparse blocks are replaced (heads read routers)."""
    pred: Predictor
    if name == "oracle":
        if recording is None:
            raise ConfigError("the oracle predictor replays a recorded routing; pass recording=")
        pred = OraclePredictor(recording, layers)
    elif name == "temporal":
        pred = TemporalPredictor(layers)
    elif name == "heads":
        if model_dir is None or not PrerouterSet.exists(model_dir):
            raise ConfigError(
                f"{model_dir}: no trained prerouter (prerouter.safetensors); train one with "
                "`edge0 train heads`, or use --predictor init (untrained heads)"
            )
        heads = PrerouterSet.load(model_dir)
        heads.check_model(model)
        pred = HeadPredictor(heads, "heads")
    elif name == "init":
        pred = HeadPredictor(PrerouterSet.from_model(model, wrap=wrap, lean=True), "init")
    else:
        raise ConfigError(f"unknown predictor {name!r}; choose one of {', '.join(PREDICTORS)}")
    if not wrap:  # no head predicts the first streamed layer
        pred.targets = {a: b for a, b in pred.targets.items() if b != layers[0]}
    log.info("predictor", name=pred.name, heads=len(pred.targets))
    return pred
