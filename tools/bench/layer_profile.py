"""Where the compute thread's CPU goes per streamed layer: exclusive thread time per function.

Wraps the functions of the decode path (the streaming block and its stream, the
sync groups, the scheduler and slot pool, the family's graph builders, mlx-lm's
own sparse block for `resident`, and `mx.eval` / `mx.async_eval`) with counters
of the compute thread's `thread_time`, then decodes one request per mode after a
warm-up. Each function's *exclusive* time (its own, minus the wrapped functions
it called) is printed in microseconds per layer-step, with its calls per
layer-step. Only the compute thread is counted: work another thread does (the
readers, the planner) does not appear. A wrapper costs ~1 us per call, so the
absolute figures sit above the unwrapped `overhead_cpu_ms_per_layer`; compare
modes and checkouts, not the totals against runtime_cost.py.

    .venv/bin/python tools/bench/layer_profile.py MODEL --modes resident,route --tokens 24
"""

from __future__ import annotations

import asyncio
import collections
import functools
import threading
import time
from typing import Any

import click
import mlx.core as mx

COMPUTE = "edge0-compute"


class Counters:
    """Exclusive and inclusive thread CPU per label, on the compute thread only."""

    def __init__(self) -> None:
        self.on = False
        self.excl: collections.Counter[str] = collections.Counter()
        self.incl: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()
        self._stack: list[float] = []

    def wrap(self, owner: Any, name: str, label: str) -> None:
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def counted(*args: Any, **kw: Any) -> Any:
            if not self.on or threading.current_thread().name != COMPUTE:
                return fn(*args, **kw)
            t0 = time.thread_time()
            self._stack.append(0.0)
            try:
                return fn(*args, **kw)
            finally:
                spent = time.thread_time() - t0
                children = self._stack.pop()
                self.incl[label] += spent
                self.excl[label] += spent - children
                self.calls[label] += 1
                if self._stack:
                    self._stack[-1] += spent

        setattr(owner, name, counted)

    def reset(self) -> None:
        self.excl.clear()
        self.incl.clear()
        self.calls.clear()


def install(c: Counters) -> None:
    import mlx_lm.models.qwen3_next as qwen3_next
    import mlx_lm.models.switch_layers as switch

    import edge0.families.base as fam
    import edge0.runtime.compute.steps as steps
    import edge0.runtime.io.fetcher as fetcher
    import edge0.runtime.io.planner as planner
    import edge0.runtime.io.readers as readers
    import edge0.runtime.io.scheduler as scheduler
    import edge0.runtime.io.slots as slots
    import edge0.runtime.layers.block as block
    import edge0.runtime.layers.single as single
    import edge0.runtime.layers.streams as layers
    import edge0.runtime.layers.syncs as syncs

    c.wrap(mx, "eval", "mx.eval")
    c.wrap(mx, "async_eval", "mx.async_eval")
    c.wrap(block, "expert_ffn", "expert_ffn")
    targets: list[tuple[Any, list[str]]] = [
        (block.StreamingMoE, ["__call__", "routed_ffn"]),
        (single.SingleToken, ["forward", "routed"]),
        (layers.RoutedStream, ["route", "planned", "needs_true"]),
        (layers.LayerStream, ["finish", "slots"]),
        (layers.Lookahead, ["graph", "issue"]),
        (layers.SlotExperts, ["acquire"]),
        (syncs.SyncGroups, ["add", "launch", "complete", "flush", "_finish"]),
        (
            scheduler.Scheduler,
            ["acquire", "evaluated", "begin_step", "_claim_step", "_consume", "prefetch", "stage"],
        ),
        (fetcher.Fetcher, ["issue", "post"]),
        (planner.Planner, ["submit", "drain"]),
        (readers.ReaderThreads, ["put"]),
        (slots.SlotPool, ["advance", "claim", "reserve", "release"]),
        (steps.Steps, ["fence", "begin_step", "span"]),
        (fam.Family, ["scores", "select", "weights", "expert_input", "combine", "extra"]),
        (qwen3_next.Qwen3NextSparseMoeBlock, ["__call__"]),
        (switch.SwitchGLU, ["__call__"]),
    ]
    for owner, names in targets:
        for name in names:
            if name in vars(owner):  # only what the class itself defines
                c.wrap(owner, name, f"{owner.__name__}.{name}")
    # families that override `extra` (the shared expert)
    for sub in _subclasses(fam.Family):
        if "extra" in vars(sub):
            c.wrap(sub, "extra", f"{sub.__name__}.extra")


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


async def profile(c: Counters, model: str, mode: str, tokens: int, tiers: str) -> dict[str, Any]:
    from edge0.runtime.engine.api import Engine

    async with Engine.open(model, mode=mode, tiers=tiers) as eng:
        ids = list(eng.tokenizer.encode("def fibonacci(n):"))[:1]
        _ = [t async for t in eng.tokens(ids, max_tokens=4, stop=False)]  # warm-up
        spent = [0.0]

        def start() -> None:
            c.reset()
            c.on = True
            spent[0] = time.thread_time()

        def stop() -> None:
            c.on = False
            spent[0] = time.thread_time() - spent[0]

        await eng._compute.run(start)
        _ = [t async for t in eng.tokens(ids, max_tokens=tokens, stop=False)]
        await eng._compute.run(stop)
        stats = eng.last_stats
        n_layers = len(eng.setup.manifest.moe_layers)
    layer_steps = n_layers * tokens
    evals = c.incl["mx.eval"] + c.incl["mx.async_eval"]
    return {
        "overhead": stats.overhead_cpu_ms_per_layer,
        "outside_eval_us": (spent[0] - evals) / layer_steps * 1e6,
        "rows": {k: (v / layer_steps * 1e6, c.calls[k] / layer_steps) for k, v in c.excl.items()},
    }


@click.command()
@click.argument("model", type=click.Path(exists=True, file_okay=False))
@click.option("--modes", default="resident,route", show_default=True)
@click.option("--tokens", default=24, show_default=True, help="Decode tokens (one request).")
@click.option("--tiers", default="ram:256MiB>pread", show_default=True)
@click.option("--top", default=30, show_default=True, help="Rows printed per mode.")
def main(model: str, modes: str, tokens: int, tiers: str, top: int) -> None:
    c = Counters()
    install(c)
    for mode in modes.split(","):
        got = asyncio.run(profile(c, model, mode, tokens, tiers))
        click.echo(
            f"## {mode}: overhead_cpu_ms_per_layer {got['overhead']:.3f} (the stats' "
            f"figure, wrappers included); compute-thread CPU outside eval "
            f"{got['outside_eval_us']:.1f} us per layer-step"
        )
        click.echo("| function | exclusive us/layer | calls/layer |")
        click.echo("|---|---|---|")
        rows = sorted(got["rows"].items(), key=lambda kv: -kv[1][0])
        for label, (us, calls) in rows[:top]:
            if not label.startswith("mx."):
                click.echo(f"| {label} | {us:.1f} | {calls:.2f} |")


if __name__ == "__main__":
    main()
