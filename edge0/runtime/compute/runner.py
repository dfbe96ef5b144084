"""One request on the compute thread: a fresh KV cache, then a token a step (or a prompt chunk:
edge0.runtime.prefill.chunks drives the runner for that).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from edge0.model.sparse import sparse_blocks
from edge0.runtime.compute.steps import Steps

__all__ = ["Runner", "Sampler", "greedy"]


Sampler = Callable[[mx.array], mx.array]


def greedy(logits: mx.array) -> mx.array:
    return mx.argmax(logits, axis=-1)


class Runner:
    """One request: a fresh KV cache, tokens fed one step at a time."""

    def __init__(self, model: nn.Module, steps: Steps, request: int, sampler: Sampler):
        self.model = model
        self.steps = steps
        self.sampler = sampler
        self.cache = make_prompt_cache(model)
        # streaming layers count themselves; with none (resident mode) every sparse layer runs
        self.uncounted = 0 if steps.layers else len(sparse_blocks(model))
        steps.begin_request(request)

    def feed(self, token: int, prefill: bool, prefetch: bool = True) -> int:
        """Run one step on `token`; return the sampled next token.

        `prefetch`: the next step runs and uses this step's predictions (False for the
        request's last step; `prefill` gives it to the last prompt token only).
        """
        steps = self.steps
        t0, c0 = time.perf_counter(), time.thread_time()
        steps.begin_step(prefill, prefetch)
        logits = self.model(mx.array([[token]]), cache=self.cache)[:, -1, :]  # (1, vocab)
        nxt = self.sampler(logits)
        steps.fence(nxt)  # the step fence: every graph of this step is evaluated
        t2, c2 = time.perf_counter(), time.thread_time()
        steps.cur.cpu = c2 - c0
        steps.cur.layers += self.uncounted
        steps.end_step(t2 - t0)
        return int(nxt.item())  # type: ignore[arg-type]

    def prefill(self, tokens: list[int], decode: bool = True) -> int:
        """Feed the prompt one token per step; return the first generated token. Only the
        last prompt step prefetches (the others are followed by prompt steps, routed by
        the true router), and only when a decode step follows (`decode`). The prompt in
        chunks is edge0.runtime.prefill.chunks."""
        nxt = -1
        for i, tok in enumerate(tokens):
            nxt = self.feed(tok, prefill=True, prefetch=decode and i == len(tokens) - 1)
        return nxt

    def finish(self) -> None:
        """The request ended (on the compute thread, after its last step)."""
        self.steps.end_request()
