"""The kernel thread count per phase chosen by timing at first use, the choice kept per machine,
and the environment's counts winning over both."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from edge0.kernels import isa, native, threads


@pytest.fixture
def mod() -> Iterator[ModuleType]:
    got = native.module()
    if got is None:
        pytest.fail(f"the native kernels are not loaded: {native.status()}")
    first = got.threads()
    yield got
    got.set_threads(first)


class SlowClock:
    """`time.perf_counter` for `threads.time_counts`: each timed pass takes `cost[n]` seconds
    with n threads set, whatever the kernel really took (the pass itself still runs)."""

    def __init__(self, mod: ModuleType, cost: dict[int, float]) -> None:
        self.mod, self.cost, self.now, self.calls = mod, cost, 0.0, 0

    def __call__(self) -> float:
        self.calls += 1
        if self.calls % 2 == 0:  # the reading after a pass
            self.now += self.cost[self.mod.threads()]
        return self.now


def test_the_choice_follows_the_timing(
    mod: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two threads timed faster for a decode step and slower for a prompt chunk: each phase
    gets its own count, and the count in use is left as it was."""
    mod.set_threads(3)
    phases: list[str] = []
    costs = {"decode": {1: 1.0, 2: 0.5}, "prompt": {1: 1.0, 2: 1.2}}
    clock = SlowClock(mod, {})
    monkeypatch.setattr(threads, "perf_counter", clock)
    real = threads.time_counts

    def timed(m: ModuleType, phase: str, counts: list[int]) -> dict[int, list[float]]:
        phases.append(phase)
        clock.cost = costs[phase]
        return real(m, phase, counts, rounds=3)

    monkeypatch.setattr(threads, "time_counts", timed)
    got = threads.choose(mod, tmp_path / "t.json", {}, counts=(1, 2))
    assert got == {"decode": 2, "prompt": 1} and phases == ["decode", "prompt"]
    assert mod.threads() == 3
    kept = next(iter(json.loads((tmp_path / "t.json").read_text()).values()))
    assert kept["decode"] == {"threads": 2, "median_ms": {"1": 1000.0, "2": 500.0}}


def test_the_choice_is_kept_and_not_timed_again(
    mod: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t.json"
    fake = {"decode": {1: [1.0] * 3, 2: [0.5] * 3}, "prompt": {1: [1.0] * 3, 2: [0.95] * 3}}
    monkeypatch.setattr(threads, "time_counts", lambda m, phase, c: fake[phase])
    assert threads.choose(mod, path, {}, counts=(1, 2)) == {"decode": 2, "prompt": 1}
    monkeypatch.setattr(threads, "time_counts", lambda *a: pytest.fail("timed again"))
    assert threads.choose(mod, path, {}, counts=(1, 2)) == {"decode": 2, "prompt": 1}
    # another set of counts (fewer CPUs), another unit or another machine is timed again
    monkeypatch.setattr(threads, "time_counts", lambda m, phase, c: {n: [1.0] for n in c})
    assert threads.choose(mod, path, {}, counts=(1, 2, 3)) == {"decode": 1, "prompt": 1}
    assert len(json.loads(path.read_text())) == 2


def test_the_environment_wins(
    mod: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forced phase is not timed; the other one is. Through `native`, the variables set
    the counts in use even where a cached choice says otherwise."""
    timed: list[str] = []

    def record(m: ModuleType, phase: str, c: list[int]) -> dict[int, list[float]]:
        timed.append(phase)
        return {1: [1.0], 2: [0.1]}

    monkeypatch.setattr(threads, "time_counts", record)
    got = threads.choose(mod, None, {"decode": 3, "prompt": None}, counts=(1, 2))
    assert got == {"decode": 3, "prompt": 2} and timed == ["prompt"]

    monkeypatch.setenv("EDGE0_CACHE", str(tmp_path))
    key = f"{isa.machine_key(mod)}|{mod.isa()}|threads {list(threads.counts_here())}"
    cached = {"decode": {"threads": 1}, "prompt": {"threads": 1}}
    threads.cache_file().write_text(json.dumps({key: cached}))
    monkeypatch.setenv("EDGE0_KERNEL_THREADS", "2")
    monkeypatch.setenv("EDGE0_PROMPT_THREADS", "3")
    native.reset()
    try:
        again = native.module()
        assert again is not None and again.threads() == 2
        with native.prompt_threads() as n:
            assert n == 3 and again.threads() == 3
        assert again.threads() == 2
    finally:
        monkeypatch.delenv("EDGE0_KERNEL_THREADS")
        monkeypatch.delenv("EDGE0_PROMPT_THREADS")
        native.reset()
    assert timed == ["prompt"]  # native found both forced: nothing was timed


def test_native_uses_the_cached_counts(
    mod: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = list(threads.counts_here())
    if len(counts) < 2:
        pytest.skip("one CPU: there is no count to choose")
    monkeypatch.setenv("EDGE0_CACHE", str(tmp_path))
    monkeypatch.delenv("EDGE0_KERNEL_THREADS", raising=False)
    monkeypatch.delenv("EDGE0_PROMPT_THREADS", raising=False)
    native.reset()
    first = native.module()
    assert first is not None
    key = f"{isa.machine_key(first)}|{first.isa()}|threads {counts}"
    table = json.loads(threads.cache_file().read_text())
    assert set(table[key]) == {"decode", "prompt"}  # timed at first use, both phases
    table[key] = {"decode": {"threads": 2}, "prompt": {"threads": 1}}
    threads.cache_file().write_text(json.dumps(table))
    monkeypatch.setattr(threads, "time_counts", lambda *a: pytest.fail("timed again"))
    native.reset()
    try:
        again = native.module()
        assert again is not None and again.threads() == 2
        assert "2 threads (prompts 1)" in native.status()
    finally:
        native.reset()


def test_pick_favours_fewer_threads_within_the_margin() -> None:
    assert threads.pick({1: [1.0, 2.0, 1.0], 2: [0.95, 1.9, 0.95]}) == 1
    assert threads.pick({1: [1.0, 2.0, 1.0], 2: [0.8, 1.6, 0.9]}) == 2
    # 4 threads beat 1 by 25% but 2 threads by less than the margin: 2
    assert threads.pick({1: [1.0] * 3, 2: [0.8] * 3, 3: [0.9] * 3, 4: [0.75] * 3}) == 2
    # per-round ratios: a loaded round slows every count alike
    assert threads.pick({1: [1.0, 5.0, 1.0], 2: [0.7, 4.0, 0.7]}) == 2
    # a decode step's bar is higher: 12% faster is not enough there
    times = {1: [1.0] * 3, 2: [0.88] * 3}
    assert threads.pick(times, threads.MARGIN["prompt"]) == 2
    assert threads.pick(times, threads.MARGIN["decode"]) == 1
