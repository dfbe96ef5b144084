"""One token through a streaming block: the executor of a one-token step, and of one under the
in-graph route policy (docs/runtime.md, "One decode step, one streamed layer").
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import mlx.core as mx

from edge0.errors import Edge0Error
from edge0.families import Family
from edge0.runtime.layers.block import StreamingMoE
from edge0.runtime.layers.policy_graph import DeviceChoice

# a grouped route step computes its gate weights and weighted sum compiled (tests compare the
# tokens and logits with this off)
COMPILED = True


class SingleToken:
    """A one-token step's executor: the true top-K, or in route mode the planned set (or the
    route policy's choice on the host), then the experts over the slots."""

    def forward(self, block: StreamingMoE, x: mx.array) -> mx.array:
        # x: (1, 1, d_model), the post-attention-norm hidden of one token
        if x.shape[0] * x.shape[1] != 1:
            raise Edge0Error(
                f"the streaming block of layer {block.layer} runs one token per step, got input "
                f"shape {tuple(x.shape)}; feed tokens one at a time (the Engine does)"
            )
        stream, fam = block.stream, block.family
        scores = fam.scores(block, x)  # (1, 1, E)
        planned = stream.planned()
        true_inds: mx.array | None = None
        w: mx.array | None = None
        if planned is None or stream.needs_true():  # (1, 1, K) each
            true_inds, w = fam.select(block, scores, stream.top_k)
        if planned is not None:  # route mode: the prediction (or the route policy's choice)
            return self.routed(block, x, scores, true_inds, w, planned)
        assert true_inds is not None and w is not None
        return _experts(block, x, true_inds, true_inds, w, None)

    def routed(
        self,
        block: StreamingMoE,
        x: mx.array,
        scores: mx.array,
        true_inds: mx.array | None,
        w: mx.array | None,
        planned: list[int],
    ) -> mx.array:
        """Route mode: the planned set (or the host policy's choice) is the routing."""
        stream, fam = block.stream, block.family
        exact = False
        if true_inds is not None:
            planned, exact = stream.choose(x, scores, true_inds, planned)
        if exact:  # the true top-K: the router's own indices and weights
            assert true_inds is not None and w is not None
            inds = true_inds
        else:
            inds = mx.array([[planned]], dtype=mx.uint32)  # (1, 1, K)
            stream.made(inds, planned)
            if _weights_later(block):
                return _grouped(block, x, scores, true_inds, inds, planned)
            w = fam.weights(block, scores, inds)
        return _experts(block, x, true_inds, inds, w, planned)


class OnDeviceToken(SingleToken):
    """A one-token step under the in-graph available-first policy
    (edge0.runtime.layers.policy_graph): a route layer's set is chosen on the device among
    the staged candidates, no readback; the other steps run as `SingleToken`."""

    def __init__(self, choice: DeviceChoice) -> None:
        self.choice = choice

    def routed(
        self,
        block: StreamingMoE,
        x: mx.array,
        scores: mx.array,
        true_inds: mx.array | None,
        w: mx.array | None,
        planned: list[int],
    ) -> mx.array:
        assert true_inds is not None and w is not None  # (a route policy ranks by the true set)
        stream, fam, choice = block.stream, block.family, self.choice
        cands = choice.candidates(stream, planned)
        inds, w = choice.graph(block, fam, scores, true_inds, w, cands, len(planned))
        stream.route(x, true_inds, inds, w, planned)  # deferred: read back with its group
        idx = choice.slots(stream, cands, inds, scores.shape[-1])
        y = block.routed_ffn(fam.expert_input(x, w), idx)  # (1, 1, K, d)
        return fam.extra(block, x, fam.combine(y, w))


def _experts(
    block: StreamingMoE,
    x: mx.array,
    true_inds: mx.array | None,
    inds: mx.array,
    w: mx.array,
    planned: list[int] | None,
) -> mx.array:
    """The routing evaluated (and the owned prediction's prefetch, read after this layer's
    own reads), the experts `inds` computed over their slots, weighted and summed."""
    stream, fam = block.stream, block.family
    experts = stream.route(x, true_inds, inds, w, planned, hold=True)
    groups = stream.arrivals(experts)
    if groups is None:
        y = block.routed_ffn(fam.expert_input(x, w), stream.slots(experts, inds))
    else:
        y = _arriving(block, fam.expert_input(x, w), groups, len(experts))
    return fam.extra(block, x, fam.combine(y, w))  # y: (1, 1, K, d)


def _weights_later(block: StreamingMoE) -> bool:
    """Whether a route step's gate weights can wait for the experts' outputs: a grouped
    decode step (its stream reads nothing back before the group's sync, and its slots come
    in one piece) of a family whose experts run on the block's input itself."""
    stream = block.stream
    return (
        COMPILED
        and stream.steps.groups is not None
        and not stream.overlaps()
        and type(block.family).expert_input is Family.expert_input
    )


def _grouped(
    block: StreamingMoE,
    x: mx.array,
    scores: mx.array,
    true_inds: mx.array | None,
    inds: mx.array,
    planned: list[int],
) -> mx.array:
    """A grouped route step's layer: the planned experts over their slots, then their gate
    weights and weighted sum as one compiled function (`StreamingMoE.weighted_sum`)."""
    stream, fam = block.stream, block.family
    experts = stream.route(x, true_inds, inds, None, planned, hold=True)
    y = block.routed_ffn(x, stream.slots(experts, inds))  # (1, 1, K, d)
    return fam.extra(block, x, block.weighted_sum(scores, inds, y))


def _arriving(
    block: StreamingMoE, h: mx.array, groups: Iterator[list[tuple[int, int]]], k: int
) -> mx.array:
    """The outputs (1, 1, k, d) of k experts computed group by group as their slots are
    ready: the first, when more follow, is launched (`mx.async_eval`) and computes while
    the rest are read. An expert's output does not depend on the others computed with
    it, and the outputs go back into routing order before the weighted sum: the same
    sum as in one op."""
    steps, layer = block.stream.steps, block.layer
    ys: list[mx.array] = []
    order: list[int] = []
    for group in groups:
        pos = [i for i, _ in group]
        idx = mx.array([[[s for _, s in group]]], dtype=mx.uint32)  # (1, 1, g)
        part = h if h.ndim == 3 else h[:, :, mx.array(pos, dtype=mx.uint32)]  # (1, 1, [g,] d)
        y = block.routed_ffn(part, idx)  # (1, 1, g, d)
        ys.append(y)
        order += pos
        if len(order) < k:  # more to come: this group computes while they are read
            t0 = time.perf_counter()
            mx.async_eval(y)
            steps.span("partial", layer, t0, time.perf_counter())
    y = mx.concatenate(ys, axis=-2) if len(ys) > 1 else ys[0]  # (1, 1, k, d), arrival order
    if order == list(range(k)):
        return y
    back = sorted(range(k), key=order.__getitem__)  # arrival index of each routing position
    return mx.take(y, mx.array(back, dtype=mx.uint32), axis=-2)
