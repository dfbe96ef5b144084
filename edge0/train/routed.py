"""Route-mode student for training and eval: resident int4 experts, routed by the prerouter.

Route mode at decode step t runs MoE layer b on the set that the head of the
previous MoE layer predicted at step t-1 (the last layer's wrap-around head
predicts the first layer; without a head, at the first token, or while the
prompt is prefilled, a layer runs its true top-K, as edge0.runtime.compute.runner does). Gate
weights come from the true router scores of the set, renormalised by the
family's rule. This module reproduces that arithmetic over
whole sequences with resident experts, in two passes:

  plan    token by token with a KV cache (no gradient): the sets each layer
          executes, exactly as the streaming runtime would choose them;
  replay  one parallel, differentiable forward that executes the recorded sets
          (sets are discrete; gradients flow through gates, attention and LoRA).

Both passes give the same logits for the same weights (tests check this).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from edge0.families import Family, family_for
from edge0.routing.prerouter import PrerouterSet, moe_blocks

Plan = dict[int, mx.array]  # MoE layer -> (B, S, K) executed expert sets


class RouteState:
    """Shared by every RoutedMoE of one model: the mode and the predictions in flight."""

    def __init__(self, heads: PrerouterSet | None, k: int, wrap: bool = True) -> None:
        self.heads = heads
        self.k = k
        self.wrap = wrap  # False: the first MoE layer is never predicted (true top-K)
        self.mode = "plan"  # "plan" | "replay"
        self.replay: Plan = {}
        self.reset()

    def reset(self, prefill: int = 0) -> None:
        """Start a sequence; its first `prefill` positions run their true top-K (the prompt)."""
        self.prefill = prefill
        self.pos = -1
        self.current: dict[int, mx.array] = {}  # target layer -> (B, 1, K), made at t-1
        self.next: dict[int, mx.array] = {}  # target layer -> (B, 1, K), made at t
        self.prev_exec: dict[int, mx.array] = {}  # layer -> (B, 1, K) executed at t-1
        self.record: dict[int, list[mx.array]] = {}

    def begin_step(self) -> None:
        self.pos += 1
        self.current, self.next = self.next, {}

    def plan(self) -> Plan:
        return {layer: mx.concatenate(sets, axis=1) for layer, sets in self.record.items()}


class RoutedMoE(nn.Module):
    """Wraps an mlx-lm sparse block (same child names, so LoRA/prerouter paths do not change)."""

    def __init__(self, original: nn.Module, layer: int, family: Family, state: RouteState):
        super().__init__()
        for name, child in original.children().items():
            setattr(self, name, child)
        for attr in ("norm_topk_prob", "top_k", "num_experts_per_tok", "num_experts"):
            if hasattr(original, attr):
                object.__setattr__(self, attr, getattr(original, attr))
        object.__setattr__(self, "original", original)
        object.__setattr__(self, "layer", layer)
        object.__setattr__(self, "family", family)
        object.__setattr__(self, "route", state)

    def _plan_sets(self, x: mx.array, scores: mx.array) -> mx.array:
        st, layer = self.route, self.layer
        planned = st.current.get(layer) if st.pos >= st.prefill else None
        if planned is None:  # prompt, or no prediction for this layer at this step: true top-K
            inds = self.family.select(self, scores, st.k)[0]
        else:
            inds = planned
        inds = mx.sort(inds.astype(mx.int32), axis=-1)
        st.record.setdefault(layer, []).append(inds)
        heads = st.heads
        target = heads.target.get(layer) if heads is not None else None
        if heads is not None and target is not None and (st.wrap or target > layer):
            pred = heads.predict_topk(layer, x, inds, st.prev_exec.get(layer), st.k)
            st.next[target] = mx.stop_gradient(pred)
        st.prev_exec[layer] = inds
        return inds

    def __call__(self, x: mx.array) -> mx.array:
        # x: (B, S, d) post-attention-norm hidden
        scores = self.family.scores(self, x)  # (B, S, E)
        if self.route.mode == "replay":
            inds = self.route.replay[self.layer][:, : x.shape[1]]
        else:
            inds = self._plan_sets(x, scores)
        inds = mx.stop_gradient(inds)  # (B, S, K)
        w = self.family.weights(self, scores, inds)  # (B, S, K)
        h, switch = self.family.expert_input(x, w), self[self.family.switch_attr]
        if h.ndim == x.ndim:  # one input for the K experts
            y = switch(h, inds)  # (B, S, K, d)
        else:  # an input per expert (Llama-4 top-k): one top-1 call each
            k = inds.shape[-1]
            y = mx.concatenate([switch(h[..., j, :], inds[..., j : j + 1]) for j in range(k)], -2)
        y = self.family.combine(y, w.astype(y.dtype))
        return self.family.extra(self, x, y)


def model_type(model: nn.Module) -> str:
    args = getattr(model, "args", None)
    return str(getattr(args, "model_type", None) or getattr(model, "model_type", ""))


def runtime_wraps() -> bool:
    """Whether `edge0 run`'s default first-layer policy is the wrap-around head."""
    from edge0.options.engine import EngineOptions

    return bool(EngineOptions().first_layer == "wrap")


@contextmanager
def routed(
    model: nn.Module, heads: PrerouterSet | None, k: int, wrap: bool | None = None
) -> Iterator[RouteState]:
    """Install RoutedMoE on every sparse layer for the duration of the block.

    `wrap`: whether the last layer's head routes the first layer (the runtime's
    `first_layer="wrap"`); otherwise the first layer runs its true top-K (its
    "resident" and "reactive" policies). None: the heads' own config.
    """
    if wrap is None:
        wrap = heads.config.wrap if heads is not None else False
    state = RouteState(heads, k, wrap)
    family = family_for(model_type(model))
    if heads is not None:
        heads.check_model(model)
    layers = model.layers
    blocks = moe_blocks(model)
    attr = family.block_attr
    try:
        for i, block in blocks:
            setattr(layers[i], attr, RoutedMoE(block, i, family, state))
        yield state
    finally:
        for i, block in blocks:
            setattr(layers[i], attr, block)


def plan_logits(
    model: nn.Module, state: RouteState, tokens: mx.array, prefill: int = 0
) -> tuple[mx.array, Plan]:
    """Teacher-forced route-mode logits (B, S, V) token by token, and the executed sets.

    The first `prefill` tokens are treated as the prompt (true top-K routing).
    """
    state.mode = "plan"
    state.reset(prefill)
    cache = make_prompt_cache(model)
    outs = []
    for t in range(tokens.shape[1]):
        state.begin_step()
        out = model(tokens[:, t : t + 1], cache=cache)  # (B, 1, V)
        mx.eval(out, state.next, state.prev_exec)
        outs.append(out)
    return mx.concatenate(outs, axis=1), state.plan()


def replay_logits(model: nn.Module, state: RouteState, tokens: mx.array, plan: Plan) -> mx.array:
    """Parallel, differentiable route-mode logits (B, S, V) executing `plan`'s sets."""
    state.mode = "replay"
    state.replay = plan
    try:
        return model(tokens)
    finally:
        state.mode = "plan"


def sample_next(logits: mx.array, temperature: float) -> mx.array:
    """(B, V) logits -> (B,) tokens; greedy at temperature 0."""
    if temperature <= 0:
        return mx.argmax(logits, axis=-1)
    return mx.random.categorical(logits * (1.0 / temperature), axis=-1)


def generate(
    model: nn.Module,
    state: RouteState | None,
    prompt: mx.array,
    new_tokens: int,
    temperature: float = 1.0,
) -> tuple[mx.array, Plan]:
    """Continue (B, P) prompts by `new_tokens` sampled tokens (route mode when `state`).

    The prompt is prefilled with true top-K routing and the continuation is routed
    by the prediction, as in edge0.runtime.compute.runner. Returns (B, P + new_tokens) tokens
    and the sets executed for inputs 0..P+n-2.
    """
    if state is not None:
        state.mode = "plan"
        state.reset(prefill=prompt.shape[1])
    cache = make_prompt_cache(model)
    seq = [prompt[:, t : t + 1] for t in range(prompt.shape[1])]
    logits: Any = None
    for t in range(prompt.shape[1] + new_tokens - 1):
        if state is not None:
            state.begin_step()
        logits = model(seq[t], cache=cache)[:, -1, :]  # (B, V)
        if t >= prompt.shape[1] - 1:
            seq.append(sample_next(logits, temperature)[:, None])
        mx.eval(seq[-1], state.next if state is not None else [])
    plan = state.plan() if state is not None else {}
    return mx.concatenate(seq, axis=1), plan
