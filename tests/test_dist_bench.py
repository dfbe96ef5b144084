"""tools/bench/dist_bench.py's summary: per-round ratios to loopback, failed rounds skipped."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "tools" / "bench"))
from dist_bench import summary, table  # noqa: E402


def run(tps: float, ring: float, net: str = "loopback", ranks: int = 2) -> dict[str, Any]:
    return dict(
        ranks=ranks,
        tiers="pread",
        net=net,
        decode_tps=tps,
        ring_ms_per_token=ring,
        rank_decode_ms=[10.0, 20.0],
        peak_rss_mib=[300.0, 200.0],
        rank_cpu_ms=[1.0, 2.0],
        blocked_ms=0.0,
        ring_bytes_per_token=8320,
        ring_trip_ms=0.3,
        rank_wall_ms=[10.0, 20.0],
        tokens=[1, 2, 3],
        load_read_mib=[130.0, 44.0],
        load_before=(1.0, 2.0, 3.0),
    )


def test_ratios_to_loopback_are_per_round_and_failed_rounds_are_skipped() -> None:
    failed = dict(ranks=2, tiers="pread", net="1gbit", failed="ran past 300 s")
    runs = {
        ("pread", "loopback", 2): [run(2.0, 10.0), run(1.0, 30.0), run(4.0, 5.0)],
        ("pread", "1gbit", 2): [run(1.0, 12.0, "1gbit"), failed, run(2.0, 9.0, "1gbit")],
    }
    loop = summary(runs, ("pread", "loopback", 2), [2])
    net = summary(runs, ("pread", "1gbit", 2), [2])
    assert loop["vs_loopback"] == 1.0 and loop["rounds"] == 3
    assert net["rounds"] == 2 and net["failed"] == ["ran past 300 s"]
    assert net["vs_loopback"] == pytest.approx(0.5)  # rounds 0 and 2, not the medians' ratio
    assert net["ring_ms_vs_loopback"] == pytest.approx(3.0)  # median of +2 and +4
    assert net["decode_tps_rounds"] == [1.0, None, 2.0]
    md = table([loop, net])
    assert "1.000 / failed / 2.000" in md


def test_a_configuration_that_never_finished_is_a_row_saying_so() -> None:
    failed = dict(ranks=2, tiers="pread", net="10gbit", failed="exit 1: boom")
    runs = {("pread", "loopback", 2): [run(2.0, 10.0)], ("pread", "10gbit", 2): [failed]}
    row = summary(runs, ("pread", "10gbit", 2), [2])
    assert row["rounds"] == 0 and "decode_tps" not in row
    assert "failed: exit 1: boom" in table([row])
