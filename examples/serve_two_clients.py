r"""One engine, two concurrent asyncio clients: requests are served FIFO, the loop stays free.

Client A asks first, client B a moment later; B's text starts only when A's is
done (FIFO), while a ticker coroutine keeps running on the same event loop the
whole time (nothing blocks it: compute runs on Edge0's compute thread, reads in
tier workers). Prints each client's first text and its stats (tok/s, the
event loop's worst lag), then how often the ticker ran meanwhile.

Run: python examples/serve_two_clients.py [MODEL_DIR] [--max-tokens N]   (default: the demo model)

ci-run: --max-tokens 4
ci-run: {model} --max-tokens 4
ci-expect: (?s)\] A first text: .*\] A done: [\d.]+ tok/s, loop lag [\d.]+ ms\n.*\] B first text:
ci-expect: (?s)\] B first text: .*\] B done: [\d.]+ tok/s, loop lag [\d.]+ ms\n.*\] ticker ran
ci-expect: ^\[ *[\d.]+s\] ticker ran [1-9]\d* times meanwhile$
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING

from _model import parse_args

import edge0

if TYPE_CHECKING:
    from edge0.runtime.engine.summary import RunStats


async def client(eng: edge0.Engine, name: str, prompt: str, t0: float, n: int) -> RunStats:
    first = None
    async for piece in eng.generate(prompt, max_tokens=n):
        if not isinstance(piece, str):
            print(
                f"[{time.perf_counter() - t0:6.2f}s] {name} done: "
                f"{piece.decode_tps:.1f} tok/s, loop lag {piece.loop_max_lag_ms:.1f} ms"
            )
            return piece
        if first is None:
            first = time.perf_counter() - t0
            print(f"[{first:6.2f}s] {name} first text: {piece!r}")
    raise RuntimeError("no stats")


async def ticker(t0: float, stop: asyncio.Event) -> int:
    ticks = 0
    while not stop.is_set():
        await asyncio.sleep(0.05)
        ticks += 1
    print(f"[{time.perf_counter() - t0:6.2f}s] ticker ran {ticks} times meanwhile")
    return ticks


async def main(path: Path, max_tokens: int) -> None:
    async with edge0.Engine.open(path, tiers="ram:8MiB>pread", mode="route") as eng:
        t0 = time.perf_counter()
        stop = asyncio.Event()
        tick = asyncio.create_task(ticker(t0, stop))
        a = asyncio.create_task(client(eng, "A", "Tell me about streams.", t0, max_tokens))
        await asyncio.sleep(0.01)
        b = asyncio.create_task(client(eng, "B", "And about experts?", t0, max_tokens))
        await asyncio.gather(a, b)
        stop.set()
        await tick


if __name__ == "__main__":
    args = parse_args(__doc__, max_tokens=24)
    from edge0.loop import run

    run(main(args.model, args.max_tokens))
