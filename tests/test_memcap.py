"""tools/memcap.py: the peak RSS it reports is the largest in the cgroup, not the wrapper's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tool_helpers import load_tool

ROOT = Path(__file__).resolve().parents[1]
_MIB = 1 << 20
# a child that holds 96 MiB of touched memory for a while (it says "ready" once it does)
HOLD = "b = bytearray(96 << 20); print('ready', flush=True); import time; time.sleep({secs})"


def test_largest_hwm_takes_the_biggest_process_and_skips_gone_ones() -> None:
    memcap = load_tool("tools/memcap.py")
    small = subprocess.Popen(["sleep", "30"])
    big = subprocess.Popen([sys.executable, "-c", HOLD.format(secs=30)], stdout=subprocess.PIPE)
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        assert big.stdout is not None and big.stdout.readline().strip() == b"ready"
        got = memcap.largest_hwm([small.pid, gone.pid, big.pid])
        assert got >= 96 * _MIB
        assert memcap.largest_hwm([small.pid]) < 96 * _MIB
        assert memcap.largest_hwm([gone.pid]) == 0
        assert memcap.largest_hwm([]) == 0
    finally:
        for proc in (small, big):
            proc.kill()
            proc.wait()
        if big.stdout is not None:
            big.stdout.close()


def test_a_wrapped_command_reports_the_wrapped_process_peak() -> None:
    """`memcap -- WRAPPER CMD` (e.g. /usr/bin/time -v): the wrapper's own RSS is tiny."""
    memcap = load_tool("tools/memcap.py")
    # "; true" keeps the shell alive as a wrapper instead of letting it exec the child
    hold = HOLD.format(secs=1)
    cmd = ["sh", "-c", f'"{sys.executable}" -c "{hold}"; true']
    try:
        out = memcap.run_capped(cmd, 1 << 30, 0.05)
    except memcap.CapError as exc:
        pytest.skip(f"no usable memory cgroup here: {exc}")
    except OSError as exc:  # a read-only or foreign cgroup hierarchy
        pytest.skip(f"cannot create a cgroup here: {exc}")
    assert out["exit"] == 0
    assert out["peak_rss"] >= 96 * _MIB
