"""The memory plan: made from headers before loading, parts that match memory, a hard promise."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from mlx.utils import tree_flatten
from runtime_helpers import PROMPT

from edge0.errors import ConfigError
from edge0.runtime.engine.api import Engine
from edge0.runtime.io.slotmem import POOL_LIMIT
from edge0.runtime.plan.memory import Footprint, given_cache, plan, with_ram
from edge0.storage.spec import format_spec, parse_spec

_MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def store(runtime_stores: dict[str, Path]) -> Path:
    return runtime_stores["qwen3_5_moe"]  # the session's read-only store (conftest.py)


def _fp(**kw: int) -> Footprint:
    base = dict(
        resident=100 * _MIB,
        resident_experts=0,
        heads=10 * _MIB,
        slot=2 * _MIB,
        record=_MIB,
        layers=10,
        top_k=4,
        kv=5 * _MIB,
        state=5 * _MIB,
        working=20 * _MIB,
        overhead=80 * _MIB,
    )
    return Footprint(**{**base, **kw})


def test_the_pool_and_the_cache_stop_at_the_store() -> None:
    """No more slots than streamed records, no RAM cache above the store; the plan says what
    it left unspent (the demo at 3 GiB planned 37,858 slots for 256 records)."""
    fp = _fp(experts=6)  # 10 layers x 6 experts: 60 records of 1 MiB, slots of 2 MiB
    fixed = 100 + 10 + 4 * 12 * 2 + 10 + 20 + 80
    align = 4096
    slots = plan((fixed + 30) * _MIB + align, fp)  # 15 more slots would pass 60 records
    assert slots.n_slots == 60 and slots.extra_slots == 12
    assert "6 MiB left unspent: the 60 streamed records (60 MiB) all fit" in slots.line()
    big = plan((fixed + 300) * _MIB + align, fp)
    assert big.cache == 0 and big.n_slots == 60 and "276 MiB left unspent" in big.line()
    given = plan((fixed + 300) * _MIB + align, fp, cache=64 * _MIB)
    assert given.n_slots == 60 and given.cache == 64 * _MIB
    assert plan((fixed + 30) * _MIB + align, _fp()).n_slots == 48 + 15  # unknown: no cap


def test_the_remainder_buys_slots_a_ram_cache_only_when_the_spec_sizes_it() -> None:
    """Free slots keep their experts with no copy: the 35B shape at 6 GiB decoded 3.22 and
    3.48 tok/s with the remainder as slots, 1.87 and 3.37 with it as a RAM cache, in two
    sittings (docs/benchmarks/budget.md)."""
    fp = _fp()
    fixed = 100 + 10 + 4 * 12 * 2 + 10 + 20 + 80  # MiB; the pool: K x (L + 2) slots of 2 MiB
    align = 4096  # the pool's buffer is over-allocated to start 4 KiB-aligned
    small = plan((fixed + 30) * _MIB + align, fp)  # one step reads 10 x 4 x 1 MiB = 40 MiB
    assert small.cache == 0 and small.extra_slots == 15 and small.n_slots == 48 + 15
    assert "more slots" in small.line()
    big = plan((fixed + 300) * _MIB + align, fp)  # more than a step's reads: slots still
    assert big.cache == 0 and big.extra_slots == 150 and "150 more slots" in big.choice
    with pytest.raises(ConfigError, match="below the .* MiB that resident weights"):
        plan(fixed * _MIB, fp)


def test_the_pool_stops_where_mlx_can_address_it() -> None:
    """A field's word view of the pool has int32 dimensions: the 35B shape at 12 GiB asked
    for a 9 GB pool and MLX refused it. Past the cap the budget is left unspent."""
    slot = 64 * _MIB
    fp = _fp(slot=slot, record=slot, experts=1000)
    cap = (POOL_LIMIT - 4096) // slot
    p = plan(20 << 30, fp)
    assert p.n_slots == cap and p.slots <= POOL_LIMIT and p.cache == 0
    assert "a slot pool holds at most 8 GiB" in p.line()


def test_a_ram_size_given_in_the_spec_is_kept_and_counted_or_refused() -> None:
    fp = _fp()
    fixed = 100 + 10 + 4 * 12 * 2 + 10 + 20 + 80  # MiB, as above
    align = 4096
    p = plan((fixed + 300) * _MIB + align, fp, cache=100 * _MIB)
    assert p.cache == 100 * _MIB and p.extra_slots == 100  # the other 200 MiB buy 2-MiB slots
    assert "keeps its 100 MiB from --tiers" in p.line()
    assert p.resident + p.heads + p.slots + p.kv + p.overhead + p.working + p.cache <= p.budget
    small = plan((fixed + 30) * _MIB + align, fp, cache=20 * _MIB)  # kept, though below a step
    assert small.cache == 20 * _MIB and small.extra_slots == 5
    with pytest.raises(ConfigError, match=r"RAM cache but --memory-budget .* give ram:30MiB"):
        plan((fixed + 30) * _MIB + align, fp, cache=512 * _MIB)
    assert given_cache("ram:512MiB>direct") == 512 * _MIB
    assert given_cache("ram:budget=1GiB,policy=lfuda>pread") == 1 << 30
    assert given_cache("ram>pread") is None and given_cache("pread") is None


def test_engine_keeps_the_given_ram_size_under_a_budget(store: Path) -> None:
    from edge0.stats import current_rss_bytes

    async def main(tiers: str) -> tuple[Any, int]:
        budget = current_rss_bytes() + 512 * _MIB  # this process's RSS counts in the plan
        async with Engine.open(
            store, mode="route", predictor="init", tiers=tiers, memory_budget=budget, context=100
        ) as eng:
            tier: Any = eng.setup.tier
            return eng.setup.memory_plan, getattr(tier, "budget", None)  # None: no RAM stage

    kept, size = asyncio.run(main("ram:3MiB>pread"))
    assert kept.cache == 3 * _MIB and size == 3 * _MIB
    assert kept.extra_slots > 0 and "keeps its 3 MiB from --tiers" in kept.line()
    chosen, size = asyncio.run(main("ram>pread"))
    # the plan's choice: the whole (tiny) store fits in slots, the rest is unspent, no cache
    assert chosen.cache == 0 and size is None and "unspent" in chosen.line()


def test_ram_stage_of_the_spec_is_sized_added_or_dropped() -> None:
    assert with_ram("ram:1GiB,policy=lfuda>pread", 1000) == "ram:1000,policy=lfuda>pread"
    assert with_ram("throttle:bw=1GB/s>direct", 1000) == "ram:1000>throttle:bw=1GB/s>direct"
    assert with_ram("ram:1GiB>pread", 0) == "pread"
    assert with_ram("pread", 0) == "pread"
    spec = "ram:1GiB,policy=lru>throttle:preset=sata>direct"
    assert format_spec(parse_spec(spec)) == spec


def test_budget_is_refused_before_anything_is_loaded(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import edge0.layout.load as load

    def no_load(*a: Any, **kw: Any) -> Any:
        raise AssertionError("loaded weights before checking the budget")

    monkeypatch.setattr(load, "load_layout", no_load)

    async def main() -> None:
        async with Engine.open(store, mode="route", tiers="pread", memory_budget="20MiB"):
            pass

    with pytest.raises(ConfigError, match="memory-budget 20 MiB is below"):
        asyncio.run(main())


def test_planned_parts_are_what_the_engine_holds(store: Path) -> None:
    async def main() -> tuple[Any, dict[str, int], int]:
        async with Engine.open(
            store,
            mode="route",
            predictor="init",
            tiers="ram>pread",
            memory_budget="1GiB",
            context=100,
        ) as eng:
            setup = eng.setup
            held = {
                "resident": sum(int(v.nbytes) for _, v in tree_flatten(setup.model.parameters()))
                + sum(
                    int(a.nbytes) for d in setup.ctx.resident_experts.values() for a in d.values()
                ),  # the first MoE layer's experts
                "heads": sum(
                    int(v.nbytes)
                    for h in setup.ctx.predictor.heads.heads.values()
                    for _, v in tree_flatten(h.parameters())
                ),
                "slots": setup.scheduler.memory.nbytes,
                "n_slots": setup.scheduler.table.n_slots,
            }
            toks = [t async for t in eng.tokens(PROMPT * 4, max_tokens=400, stop=False)]
            return setup.memory_plan, held, len(toks)

    p, held, n = asyncio.run(main())
    assert p.resident == held["resident"] and p.heads == held["heads"]
    assert p.n_slots == held["n_slots"] and p.slots == held["slots"]
    assert n == 100 - len(PROMPT * 4)  # the request stops at the planned context


SCRIPT = textwrap.dedent("""
    import asyncio, sys
    from edge0.runtime.engine.api import Engine

    async def main():
        path, mode, k, budget, first = sys.argv[1], sys.argv[2], int(sys.argv[3]), *sys.argv[4:6]
        async with Engine.open(path, mode=mode, top_k=k, first_layer=first, tiers="ram>pread",
                               memory_budget=budget, context=256) as eng:
            print(eng.setup.memory_plan.line(), flush=True)
            async for _ in eng.tokens(list(range(3, 40)), max_tokens=12, stop=False):
                pass

    asyncio.run(main())
    print("done", flush=True)
    sys.stdin.read()  # the parent reads our peak RSS, then closes stdin
""")


def _peak_rss_of(args: list[str]) -> tuple[int, str]:
    """Run a child to its end; its peak RSS as the kernel counts it (VmHWM), and its output.

    Read from /proc while the child waits at its end (ru_maxrss of a child would
    include the forking parent's peak)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(
        [sys.executable, "-c", SCRIPT, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
    ) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.strip() == "done":
                break
        status = Path(f"/proc/{proc.pid}/status").read_text()
        proc.stdin.close()
        lines.append(proc.stdout.read())
    out = "".join(lines)
    if proc.returncode != 0:
        raise ConfigError(out)
    hwm = next(ln for ln in status.splitlines() if ln.startswith("VmHWM:"))
    return int(hwm.split()[1]) * 1024, out


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edge0.synth.layout import synthesize

    out = tmp_path_factory.mktemp("small") / "small"
    synthesize("small", out)
    return out


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss in kB and VmHWM are Linux's")
@pytest.mark.parametrize(
    "mode, k, first",
    [("route", 8, "wrap"), ("hint", 4, "wrap"), ("reactive", 2, "wrap"), ("route", 4, "resident")],
)
def test_peak_rss_stays_within_a_tight_budget(small: Path, mode: str, k: int, first: str) -> None:
    """The smallest budget the plan accepts, plus 4 MiB: the child's real peak RSS fits
    (`resident`: the first layer's 14 MiB of experts are loaded, memory.load_bytes)."""
    with pytest.raises(ConfigError) as refused:  # ask for 1 MiB to learn the minimum
        _peak_rss_of([str(small), mode, str(k), "1MiB", first])
    need = int(str(refused.value).split(" MiB that ")[0].split("is below the ")[-1])
    budget = (need + 4) * _MIB
    peak, out = _peak_rss_of([str(small), mode, str(k), str(budget), first])
    assert "memory budget" in out
    assert peak <= budget, f"peak RSS {peak / _MIB:.1f} MiB over the {budget / _MIB:.0f} MiB budget"
