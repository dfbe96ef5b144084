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


def test_what_the_capped_pool_leaves_makes_whole_layers_resident() -> None:
    """Past the pool's cap whole streamed layers become resident, more as the budget grows,
    never more than are streamed; their experts, the load transient and the smaller pool
    are counted, and the plan line says how many and why."""
    slot, layer = 64 * _MIB, 1500 * _MIB
    fp = _fp(slot=slot, record=slot, experts=1000, layer_experts=layer, layer_load=3 * _MIB)
    cap = (POOL_LIMIT - 4096) // slot
    seen, last = [], 0
    for gib in range(8, 30):
        p = plan(gib << 30, fp)
        assert p.spent <= p.budget and p.resident_layers <= fp.layers
        assert p.resident_layers >= last  # a larger budget never fewer
        last = p.resident_layers
        if 0 < p.resident_layers < fp.layers:  # the pool stays at its cap
            assert p.n_slots == cap and p.load == 3 * _MIB
            assert p.resident == fp.resident + p.resident_layers * layer
            assert f"{p.resident_layers} more MoE layers are resident" in p.line()
            spare = p.budget - p.spent
            assert spare < layer  # no room was left for one more layer
        seen.append(p.resident_layers)
    assert seen[0] == 0 and 1 < len(set(seen)) and seen[-1] == fp.layers
    whole = plan(29 << 30, fp)
    assert whole.n_slots == 0 and whole.slots == 0 and "every streamed MoE layer" in whole.line()
    assert plan(20 << 30, fp, cache=64 * _MIB).resident_layers == 0  # a sized RAM cache: as was
    assert plan(20 << 30, _fp(slot=slot, record=slot, experts=1000)).resident_layers == 0


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
    # the plan's choice: no cache; the whole (tiny) store fits resident, so nothing streams
    assert chosen.cache == 0 and size is None and chosen.n_slots == 0
    assert "every streamed MoE layer fits resident" in chosen.line()


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


BASE = 200 * _MIB  # the process baseline the plan is told (build.current_rss_bytes)


@pytest.fixture(scope="module")
def wide(runtime_store_root: Path) -> Path:
    """64 experts a layer: one layer's experts outweigh the pool's few slots, as on the 35B
    shape (the default fixture's 8 padded records a layer cost more as slots than resident)."""
    from runtime_helpers import build_store

    return build_store(runtime_store_root, "qwen3_5_moe", experts=64)


def budget_for(store: Path, n: int, **opts: Any) -> int:
    """The smallest budget whose plan makes `n` streamed layers resident (`n` = -1: the
    largest that makes none), with the pool capped at two slots above the rule's (the
    caller patches `POOL_LIMIT` to `cap_pool`) and a `BASE` process."""
    from edge0.kernels import native
    from edge0.layout.manifest import Manifest
    from edge0.options.engine import EngineOptions
    from edge0.runtime.plan.footprint import footprint

    native.module()  # the kernels decide which stacks stay narrow
    fp = footprint(store, Manifest.load(store), EngineOptions(**opts), BASE)

    def made(b: int) -> int:
        try:
            return plan(b, fp).resident_layers
        except ConfigError:
            return -1

    lo, hi = BASE, 2 * BASE + (1 << 30)  # made(lo) < max(n, 1) <= made(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if made(mid) < max(n, 1) else (lo, mid)
    b = lo if n < 0 else hi
    assert made(b) == max(n, 0)
    return b


def cap_pool(store: Path, monkeypatch: pytest.MonkeyPatch, **opts: Any) -> None:
    """`POOL_LIMIT` two slots above the rule's pool, the plan's baseline `BASE`: a tiny
    store's pool reaches its cap as the 35B shape's does at 8 GiB."""
    import edge0.runtime.plan.memory as memory
    import edge0.runtime.setup.build as build
    from edge0.layout.manifest import Manifest
    from edge0.options.engine import EngineOptions
    from edge0.runtime.io.slotmem import ALIGN
    from edge0.runtime.plan.footprint import footprint

    fp = footprint(store, Manifest.load(store), EngineOptions(**opts), BASE)
    monkeypatch.setattr(memory, "POOL_LIMIT", (fp.min_slots + 2) * fp.slot + ALIGN)
    monkeypatch.setattr(build, "current_rss_bytes", lambda: BASE)


@pytest.mark.parametrize("more", [-1, 2, 3])
def test_planned_parts_are_what_the_engine_holds(
    wide: Path, more: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slots only (the pool at its cap), two more layers resident, and every layer."""
    store = wide
    opts: dict[str, Any] = dict(mode="route", predictor="init", context=100)
    cap_pool(store, monkeypatch, **opts)
    budget = budget_for(store, more, **opts)

    async def main() -> tuple[Any, dict[str, Any], int]:
        async with Engine.open(store, tiers="ram>pread", memory_budget=budget, **opts) as eng:
            setup = eng.setup
            held = {
                "resident": sum(int(v.nbytes) for _, v in tree_flatten(setup.model.parameters()))
                + sum(
                    int(a.nbytes) for d in setup.ctx.resident_experts.values() for a in d.values()
                ),  # the first MoE layer's experts, and the plan's
                "layers": sorted(setup.ctx.resident_experts),
                "heads": sum(
                    int(v.nbytes)
                    for h in setup.ctx.predictor.heads.heads.values()
                    for _, v in tree_flatten(h.parameters())
                ),
            }
            reads = setup.scheduler  # None: nothing is streamed
            held["slots"] = reads.memory.nbytes if reads else 0
            held["n_slots"] = reads.table.n_slots if reads else 0
            held["streamed"] = list(reads.table.order) if reads else []
            toks = [t async for t in eng.tokens(PROMPT * 4, max_tokens=400, stop=False)]
            return setup.memory_plan, held, len(toks)

    p, held, n = asyncio.run(main())
    assert p.resident_layers == max(more, 0) and len(held["layers"]) == 1 + p.resident_layers
    assert not set(held["layers"]) & set(held["streamed"])
    assert p.resident == held["resident"] and p.heads == held["heads"]
    assert p.n_slots == held["n_slots"] and p.slots == held["slots"]
    assert p.spent <= p.budget
    assert n == 100 - len(PROMPT * 4)  # the request stops at the planned context


def test_resident_layers_keep_the_tokens_exact(wide: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """hint and reactive with layers the plan made resident, and route with every layer
    resident, give resident mode's tokens."""

    def tokens(kept: int, **opts: Any) -> list[int]:
        async def go() -> list[int]:
            async with Engine.open(wide, tiers="pread", **opts) as eng:
                if opts["mode"] != "resident":
                    assert len(eng.setup.ctx.resident_experts) == 1 + kept  # and the first
                return [t async for t in eng.tokens(PROMPT, max_tokens=12, stop=False)]

        return asyncio.run(go())

    want = tokens(0, mode="resident", context=100)
    for mode, more in (("hint", 2), ("reactive", 1), ("route", 3)):
        opts: dict[str, Any] = dict(mode=mode, context=100)
        if mode != "reactive":
            opts["predictor"] = "init"
        cap_pool(wide, monkeypatch, **opts)
        budget = budget_for(wide, more, **opts)
        assert tokens(more, memory_budget=budget, **opts) == want, mode


def test_a_batch_over_resident_layers_decodes_as_resident(
    wide: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two requests batched in hint mode with a layer the plan made resident: each gets
    resident mode's tokens."""
    prompts = [PROMPT, [9, 3, 77, 12]]

    async def alone(prompt: list[int]) -> list[int]:
        async with Engine.open(wide, mode="resident", context=100) as eng:
            return [t async for t in eng.tokens(prompt, max_tokens=8, stop=False)]

    want = [asyncio.run(alone(p)) for p in prompts]
    opts: dict[str, Any] = dict(mode="hint", predictor="init", context=100, max_batch=2)
    cap_pool(wide, monkeypatch, **opts)
    budget = budget_for(wide, 1, **opts)

    async def main() -> tuple[list[list[int]], int]:
        async with Engine.open(wide, tiers="pread", memory_budget=budget, **opts) as eng:

            async def one(prompt: list[int]) -> list[int]:
                return [t async for t in eng.tokens(prompt, max_tokens=8, stop=False)]

            got = await asyncio.gather(*(one(p) for p in prompts))
            assert eng.batcher is not None and max(s.rows for s in eng.batcher.log) == 2
            return list(got), len(eng.setup.ctx.resident_experts)

    got, kept = asyncio.run(main())
    assert kept == 2 and got == want


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


def _start_child(args: list[str]) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
    )


def _peak_rss_of(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """Run a child to its end; its peak RSS as the kernel counts it (VmHWM), and its output.

    Read from /proc while the child waits at its end (ru_maxrss of a child would
    include the forking parent's peak)."""
    with proc:
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


TIGHT = [
    ("route", 8, "wrap"),
    ("hint", 4, "wrap"),
    ("reactive", 2, "wrap"),
    ("route", 4, "resident"),
]
Tight = tuple[str, int, str]


@pytest.fixture(scope="module")
def tight_runs(request: pytest.FixtureRequest, small: Path) -> dict[Tight, Any]:
    """Each selected case's two children, the cases side by side (a child's VmHWM is its own):
    asked for 1 MiB to learn the minimum, then run at the minimum plus 4 MiB. Per case: the
    refusal, the budget, and the child's peak RSS and output (or its error)."""
    cases = [
        (i.callspec.params["mode"], i.callspec.params["k"], i.callspec.params["first"])
        for i in request.session.items
        if i.module is request.module
        and i.originalname == "test_peak_rss_stays_within_a_tight_budget"
    ]
    starts = {c: _start_child([str(small), c[0], str(c[1]), "1MiB", c[2]]) for c in cases}
    refusals: dict[Tight, ConfigError | None] = {}
    for case, proc in starts.items():
        try:
            _peak_rss_of(proc)
            refusals[case] = None
        except ConfigError as exc:
            refusals[case] = exc
    budgets, runs = {}, {}
    for (mode, k, first), refused in refusals.items():
        if refused is not None:
            need = int(str(refused).split(" MiB that ")[0].split("is below the ")[-1])
            budgets[mode, k, first] = (need + 4) * _MIB
            args = [str(small), mode, str(k), str(budgets[mode, k, first]), first]
            runs[mode, k, first] = _start_child(args)
    got: dict[Tight, Any] = {}
    for case, refused in refusals.items():
        try:
            run: tuple[int, str] | ConfigError = (
                _peak_rss_of(runs[case]) if case in runs else (0, "")
            )
        except ConfigError as exc:  # refused at its minimum too: raised in its own test
            run = exc
        got[case] = refused, budgets.get(case, 0), run
    return got


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss in kB and VmHWM are Linux's")
@pytest.mark.parametrize("mode, k, first", TIGHT)
def test_peak_rss_stays_within_a_tight_budget(
    tight_runs: dict[Tight, Any], mode: str, k: int, first: str
) -> None:
    """The smallest budget the plan accepts, plus 4 MiB: the child's real peak RSS fits
    (`resident`: the first layer's 14 MiB of experts are loaded, memory.load_bytes)."""
    refused, budget, run = tight_runs[mode, k, first]
    assert refused is not None, "1 MiB was not refused"  # asked for it to learn the minimum
    if isinstance(run, ConfigError):
        raise run
    peak, out = run
    assert "memory budget" in out
    assert peak <= budget, f"peak RSS {peak / _MIB:.1f} MiB over the {budget / _MIB:.0f} MiB budget"
