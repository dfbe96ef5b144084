"""A solo request's decode steps back to back on the compute thread, each token handed to the event
loop as it comes (docs/runtime.md, "The Engine API"): no round trip through the loop between steps.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from edge0.runtime.engine.requests import Request
from edge0.runtime.engine.summary import RunStats


class Feeds(Protocol):
    """A request's runner as the decode loop drives it (compute.runner.Runner, a rank 0's)."""

    def feed(self, token: int, prefill: bool, prefetch: bool = True) -> int: ...


class Decoding:
    """One request's decode: `take` (on the loop) counts, queues and ends on each token as the
    worker did between steps; `steps` (on the compute thread) feeds them.

    The compute thread decides alone what it can (EOS, `max_tokens`) and reads the request's
    `cancelled` flag between steps, so it stops where the worker stopped; a token it makes
    after the loop has ended the request is dropped (`done`), and `halt` (the worker was
    cancelled: the engine is closing) stops it after the step under way.
    """

    def __init__(self, req: Request, stats: RunStats, t1: float) -> None:
        self.req = req
        self.stats = stats
        self.t1 = t1  # when decode began (the prompt's last step returned)
        self.n = 0  # tokens generated (queued for the consumer)
        self.done = False  # the request ended: EOS, max_tokens, or cancelled
        self.halt = False

    # --- on the event loop ---------------------------------------------------------------
    def take(self, tok: int, step: bool = True) -> None:
        """The next token (`step`: made by a decode step, not the prompt's last)."""
        if self.done:
            return
        req, stats = self.req, self.stats
        if step:
            stats.decode_steps += 1
        if tok in req.eos:
            stats.finish_reason = "stop"
            self.done = True
            return
        self.n += 1
        stats.generated_tokens = self.n
        stats.decode_s = time.perf_counter() - self.t1
        req.put(tok)
        if self.n >= req.max_tokens:
            stats.finish_reason = "length"
            self.done = True
        elif req.cancelled:  # finish_reason stays "cancelled"
            self.done = True

    # --- on the compute thread -----------------------------------------------------------
    def steps(self, runner: Feeds, tok: int, loop: asyncio.AbstractEventLoop) -> None:
        """Feed steps from `tok`, the request's last token (the `n`-th, taken), until EOS,
        `max_tokens`, cancellation or `halt`; each token goes to `take` on the loop."""
        req, n = self.req, self.n
        while True:
            more = n + 1 < req.max_tokens  # else no prefetch: no step uses it
            tok = runner.feed(tok, False, more)
            loop.call_soon_threadsafe(self.take, tok)
            if tok in req.eos:
                return
            n += 1
            if n >= req.max_tokens or req.cancelled or self.halt:
                return
