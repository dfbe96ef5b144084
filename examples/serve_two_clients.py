"""One engine, two concurrent asyncio clients: requests are served FIFO, the loop stays free.

Client A asks first, client B a moment later; B's text starts only when A's is
done (FIFO), while a ticker coroutine keeps running on the same event loop the
whole time (nothing blocks it: compute runs on Edge0's compute thread, reads in
tier workers). Each client then prints its stats.

Run: python examples/serve_two_clients.py [MODEL_DIR]   (default: a tiny demo model)
"""

from __future__ import annotations

import asyncio
import time

from _model import model_dir

import edge0
from edge0.runtime.engine import run
from edge0.runtime.summary import RunStats


async def client(eng: edge0.Engine, name: str, prompt: str, t0: float) -> RunStats:
    first = None
    async for piece in eng.generate(prompt, max_tokens=24):
        if isinstance(piece, RunStats):
            print(f"[{time.perf_counter() - t0:6.2f}s] {name} done: "
                  f"{piece.decode_tps:.1f} tok/s, loop lag {piece.loop_max_lag_ms:.1f} ms")
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


async def main() -> None:
    async with edge0.Engine.open(model_dir(), tiers="ram:8MiB>pread", mode="route") as eng:
        t0 = time.perf_counter()
        stop = asyncio.Event()
        tick = asyncio.create_task(ticker(t0, stop))
        a = asyncio.create_task(client(eng, "A", "Tell me about streams.", t0))
        await asyncio.sleep(0.01)
        b = asyncio.create_task(client(eng, "B", "And about experts?", t0))
        await asyncio.gather(a, b)
        stop.set()
        await tick


if __name__ == "__main__":
    run(main())
