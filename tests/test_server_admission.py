"""Admission control on its own (no server): places are given first come, first served, a full
queue refuses with Retry-After, a waiter that leaves frees its place in the queue; and the idle
trim runs once the server stays idle."""

from __future__ import annotations

import asyncio

import pytest

from edge0.errors import RequestError
from edge0.server import idle
from edge0.server.admission import Admission
from edge0.server.metrics import ServerMetrics


def _admission(places: int, queue: int) -> Admission:
    return Admission(places, queue, ServerMetrics())


async def _hold(adm: Admission, n: int, log: list[str], name: str, gate: asyncio.Event) -> None:
    async with adm.place(n):
        log.append(name)
        await gate.wait()


def test_places_are_given_in_arrival_order_and_a_full_queue_refuses() -> None:
    async def main() -> None:
        adm = _admission(places=2, queue=4)
        log: list[str] = []
        gates = {name: asyncio.Event() for name in "abcd"}
        tasks = {}
        for name, n in (("a", 2), ("b", 1), ("c", 2), ("d", 1)):  # a runs, b c d wait
            tasks[name] = asyncio.create_task(_hold(adm, n, log, name, gates[name]))
            await asyncio.sleep(0)
        assert log == ["a"] and adm.queued == 4
        with pytest.raises(RequestError) as err:
            adm.check(1)  # 4 waiting + 1 > 4: refused, with a wait estimate
        assert err.value.status == 429 and int(err.value.headers["retry-after"]) >= 1
        gates["a"].set()
        await asyncio.sleep(0.01)
        assert log == ["a", "b"]  # c (2 places) does not fit beside b; d may not pass it
        gates["b"].set()
        await asyncio.sleep(0.01)
        assert log == ["a", "b", "c"]
        gates["c"].set()
        gates["d"].set()
        await asyncio.gather(*tasks.values())
        assert log == ["a", "b", "c", "d"] and adm.busy == 0 and adm.queued == 0

    asyncio.run(main())


def test_a_waiter_that_leaves_frees_its_place_in_the_queue() -> None:
    async def main() -> None:
        adm = _admission(places=1, queue=1)
        gate = asyncio.Event()
        log: list[str] = []
        first = asyncio.create_task(_hold(adm, 1, log, "first", gate))
        await asyncio.sleep(0)
        second = asyncio.create_task(_hold(adm, 1, log, "second", gate))
        await asyncio.sleep(0)
        assert adm.queued == 1
        with pytest.raises(RequestError):
            adm.check(1)
        second.cancel()  # the client went away while queued
        await asyncio.gather(second, return_exceptions=True)
        assert adm.queued == 0
        adm.check(1)  # room again
        gate.set()
        await first
        assert adm.busy == 0 and log == ["first"]

    asyncio.run(main())


def test_the_idle_trim_runs_once_the_server_stays_idle() -> None:
    calls: list[int] = []

    async def action() -> None:
        calls.append(1)

    async def main() -> None:
        busy = [True]
        trim = idle.IdleTrim(lambda: not busy[0], action, delay=0.05)
        trim.soon()
        await asyncio.sleep(0.1)
        assert trim.trims == 0  # busy again when the delay ran out: no trim
        busy[0] = False
        trim.soon()
        trim.soon()  # a second call moves the one timer, it does not add one
        await asyncio.sleep(0.2)
        assert trim.trims == 1
        await trim.close()

    asyncio.run(main())
    assert calls == [1]
