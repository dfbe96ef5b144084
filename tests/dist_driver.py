"""Rank 0 of a test pipeline, in its own process: `python tests/dist_driver.py PATH OPTIONS_JSON`.

Prints one JSON line: the greedy tokens of each prompt in OPTIONS["prompts"] and the
per-rank stats, or {"error": ..., "type": ..., "seconds": ...} when a request fails.
OPTIONS["fault"] = {"after": n, "signal": "KILL" | "STOP"} signals rank 1 after n tokens;
OPTIONS["sampling"] = SamplingSettings fields; OPTIONS["bad_rank_path"] starts rank 1 on a
model path that does not exist.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import edge0.ranks.launch
from edge0.errors import Edge0Error
from edge0.model.generate import SamplingSettings
from edge0.ranks.launch import node_of
from edge0.ranks.pipeline import gather_stats
from edge0.runtime.engine.api import Engine


def start_ranks_on_a_missing_model() -> None:
    spawn = edge0.ranks.launch.Ranks.__init__

    def bad(self: Any, cluster: Any, path: Path, opts_text: str, split: Any) -> None:
        spawn(self, cluster, Path("/nonexistent/model"), opts_text, split)

    edge0.ranks.launch.Ranks.__init__ = bad  # type: ignore[method-assign]


async def main(path: str, options: dict[str, Any]) -> dict[str, Any]:
    prompts = options.pop("prompts")
    max_tokens = options.pop("max_tokens", 8)
    fault = options.pop("fault", None)
    sampling = SamplingSettings(**options.pop("sampling", {}))
    if options.pop("bad_rank_path", False):
        start_ranks_on_a_missing_model()
    out: dict[str, Any] = {"tokens": []}
    t0 = time.perf_counter()
    try:
        eng_cm = Engine.open(path, **options)
        eng = await eng_cm.__aenter__()
    except Edge0Error as exc:
        return dict(error=str(exc), type=type(exc).__name__, seconds=time.perf_counter() - t0)
    try:
        node = node_of(eng)
        for ids in prompts:
            toks: list[int] = []
            t0 = time.perf_counter()
            try:
                async for tok in eng.tokens(
                    ids, max_tokens=max_tokens, sampling=sampling, stop=False
                ):
                    toks.append(tok)
                    if fault is not None and len(toks) == fault["after"]:
                        t0 = time.perf_counter()
                        os.kill(node.procs[0].pid, getattr(signal, "SIG" + fault["signal"]))
            except Edge0Error as exc:
                out.update(
                    error=str(exc),
                    type=type(exc).__name__,
                    partial=toks,
                    seconds=time.perf_counter() - t0,
                )
                t1 = time.perf_counter()
                try:  # the next request fails at once with the same error
                    async for _ in eng.tokens(ids, max_tokens=2):
                        pass
                except Edge0Error as again:
                    out.update(again=str(again), again_seconds=time.perf_counter() - t1)
                return out
            out["tokens"].append(toks)
        out["stats"] = await eng._compute.run(lambda: gather_stats(node))
        out["split"] = [[r.start, r.stop] for r in node.split.ranges]
        plan = eng.setup.memory_plan
        out["plan"] = None if plan is None else plan.line()
    finally:
        await eng_cm.__aexit__(None, None, None)
    return out


if __name__ == "__main__":
    result = asyncio.run(main(sys.argv[1], json.loads(sys.argv[2])))
    print(json.dumps(result), flush=True)
