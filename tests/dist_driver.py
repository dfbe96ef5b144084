"""Rank 0 of a test pipeline, in its own process: `python tests/dist_driver.py PATH OPTIONS_JSON`.

Prints one JSON line: the greedy tokens of each prompt in OPTIONS["prompts"] and the
per-rank stats, or {"error": ..., "type": ..., "seconds": ...} when a request fails.
OPTIONS["fault"] = {"after": n, "signal": "KILL" | "STOP"} signals rank 1 after n tokens.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from typing import Any

from edge0.dist.launch import node_of
from edge0.dist.pipeline import gather_stats
from edge0.errors import Edge0Error
from edge0.runtime.engine import Engine


async def main(path: str, options: dict[str, Any]) -> dict[str, Any]:
    prompts = options.pop("prompts")
    max_tokens = options.pop("max_tokens", 8)
    fault = options.pop("fault", None)
    out: dict[str, Any] = {"tokens": []}
    async with Engine.open(path, **options) as eng:
        node = node_of(eng)
        for ids in prompts:
            toks: list[int] = []
            t0 = time.perf_counter()
            try:
                async for tok in eng.tokens(ids, max_tokens=max_tokens, stop=False):
                    toks.append(tok)
                    if fault is not None and len(toks) == fault["after"]:
                        t0 = time.perf_counter()
                        os.kill(node.procs[0].pid, getattr(signal, "SIG" + fault["signal"]))
            except Edge0Error as exc:
                out.update(error=str(exc), type=type(exc).__name__, partial=toks,
                           seconds=time.perf_counter() - t0)  # fmt: skip
                t1 = time.perf_counter()
                try:  # the next request fails at once with the same error
                    async for _ in eng.tokens(ids, max_tokens=2):
                        pass
                except Edge0Error as again:
                    out.update(again=str(again), again_seconds=time.perf_counter() - t1)
                return out
            out["tokens"].append(toks)
        out["stats"] = await eng._compute.run(lambda: gather_stats(node))
    return out


if __name__ == "__main__":
    result = asyncio.run(main(sys.argv[1], json.loads(sys.argv[2])))
    print(json.dumps(result), flush=True)
