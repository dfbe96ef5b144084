"""Ranks on emulated separate machines: each in its own network namespace, joined by veth links
shaped with tbf (tools/netns_ranks.py); tokens equal one process. Needs root (skipped otherwise)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_helpers import build_store
from test_dist import DRIVER, PROMPTS, mode_options, single

TOOL = Path(__file__).parents[1] / "tools" / "netns_ranks.py"


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {ln.split()[0] for ln in out.splitlines() if ln.startswith("e0r-")}


def why_not() -> str | None:
    """None when this machine can make network namespaces, else the reason."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux-only"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2 (ip, tc)"
    if os.geteuid() != 0:
        return "needs root to create network namespaces (ip netns add)"
    return None


needs_netns = pytest.mark.skipif(why_not() is not None, reason=why_not() or "")


@needs_netns
@pytest.mark.parametrize("mode", ["resident", "route"])
def test_two_ranks_in_their_own_namespaces_match_one_process(tmp_path: Path, mode: str) -> None:
    """Rank 0 in e0r-*-0, rank 1 started through the EDGE0_SSH shim in e0r-*-1, the ring over
    10.213.0.1 and .2 only (an address that exists in no other namespace: rank 1 could not
    bind it anywhere else), both link ends shaped to 1 Gbit/s."""
    path = build_store(tmp_path, "qwen3_5_moe")
    opts = mode_options(mode)
    before = namespaces()
    options = dict(opts, prompts=PROMPTS, hosts="{hosts}", rank_timeout=60)
    proc = subprocess.Popen(
        [
            sys.executable,
            str(TOOL),
            "run",
            "--ranks",
            "2",
            "--rate",
            "1gbit",
            "--timeout",
            "170",
            "--",
            sys.executable,
            str(DRIVER),
            str(path),
            json.dumps(options),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    want = single(path, **opts)  # meanwhile, here
    try:
        out, err = proc.communicate(timeout=200)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    got = json.loads(out.strip().splitlines()[-1])
    assert got["tokens"] == want
    assert [int(s["rank"]) for s in got["stats"]] == [0, 1]
    for s in got["stats"]:  # the last request's 7 decode steps, timed on every rank
        assert s["decode_steps"] == 7 and 0 < s["decode_wall_s"] < s["wall_s"], s
    assert namespaces() == before  # torn down


def test_the_ssh_shim_enters_only_its_own_namespaces() -> None:
    proc = subprocess.run(
        [sys.executable, str(TOOL), "ssh", "somehost", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "'somehost' is not a namespace made by this tool" in proc.stderr


def test_a_bad_rate_is_refused_before_anything_is_made() -> None:
    proc = subprocess.run(
        [sys.executable, str(TOOL), "run", "--rate", "fast", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--rate 'fast': give tc's form" in proc.stderr
