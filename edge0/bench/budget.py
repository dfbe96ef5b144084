"""`edge0 bench budget`: decode speed at each memory budget, each run inside a memory cgroup of
that size (page cache counted), as a table, JSON and a plot of tok/s against budget."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from edge0.bench.cgroup import CapError, Cgroup, run_capped
from edge0.bench.llama_peer import Peer
from edge0.errors import ConfigError
from edge0.layout import pagecache
from edge0.storage.spec import parse_size

_MIB = 1 << 20
PROMPT_LEN = 16  # the prompt length of the budgets' `bench run`s (its default), for llama.cpp too


def parse_budgets(text: str) -> list[int]:
    """Bytes of each comma-separated size ("2.2GiB,3GiB"), ascending, each once."""
    sizes = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            sizes.add(parse_size(part))
        except ValueError as exc:
            raise ConfigError(f"--budgets: {exc}") from None
    if not sizes:
        raise ConfigError("--budgets: give one size or more, e.g. --budgets 2.2GiB,3GiB,6GiB")
    return sorted(sizes)


def check_cgroups() -> None:
    """A CapError (one line: why, and the fix) unless a memory cgroup can be made here."""
    Cgroup(f"edge0-budget-probe-{os.getpid()}", 1 << 30).remove()


def inner_command(model: str, budget: int, run_args: list[str], out: Path) -> list[str]:
    """`edge0 bench run` of one budget: the engine's budget is the cgroup's limit."""
    return [
        sys.executable,
        "-m",
        "edge0",
        "bench",
        "run",
        model,
        "--memory-budget",
        f"{budget // _MIB}MiB",
        *run_args,
        "--json",
        str(out),
    ]


def evict(paths: list[Path]) -> None:
    """Drop each file's pages from the page cache (POSIX_FADV_DONTNEED).

    A memory cgroup is charged for the pages its processes bring in; pages already cached
    (by an earlier run, whose cgroup is gone, or by whoever wrote the file) are charged
    elsewhere, so a run that maps or reads them gets memory its cap does not count. Each
    budget's runs start with their files out of the cache instead."""
    for path in paths:
        pagecache.drop(path)


def model_files(model: str) -> list[Path]:
    """The files of a local model directory a run reads (none for a hub id)."""
    path = Path(model)
    return sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else []


def row(budget: int, cap: dict[str, Any], report: dict[str, Any] | None) -> dict[str, Any]:
    """One budget's figures: the run's medians and what its cgroup saw."""
    got: dict[str, Any] = {
        "budget_bytes": budget,
        "exit": cap["exit"],
        "cgroup_limit_bytes": cap["limit"],
        "cgroup_peak_bytes": cap["peak_usage"],
        "peak_page_cache_bytes": cap["peak_page_cache"],
        "limit_hits": cap["limit_hits"],
        "oom_kills": cap["oom_kills"],
        "peak_rss_bytes": cap["peak_rss"],
        "seconds": cap["seconds"],
    }
    variant = (report or {}).get("variants", [{}])[0]
    median = variant.get("median") or {}
    for key in ("decode_tps", "compute_ms_per_step", "blocked_ms_per_step", "bytes_per_token"):
        got[key] = median.get(key)
    got["errors"] = variant.get("errors", []) if report else ["the run wrote no result"]
    got["memory_plans"] = [r.get("memory_plan") for r in variant.get("runs", [])]  # plan lines
    return got


def peer_row(cap: dict[str, Any], report: dict[str, Any] | None) -> dict[str, Any]:
    """llama.cpp's figures at one budget: decode tok/s and what its cgroup saw."""
    return {
        "decode_tps": report["decode_tps"] if report else None,
        "exit": cap["exit"],
        "cgroup_peak_bytes": cap["peak_usage"],
        "peak_rss_bytes": cap["peak_rss"],
        "oom_kills": cap["oom_kills"],
        "seconds": cap["seconds"],
    }


def sweep(
    model: str,
    budgets: list[int],
    run_args: list[str],
    interval: float = 0.2,
    peer: Peer | None = None,
    tokens: int = 16,
    prompts: int = 2,
) -> list[dict]:
    """Each budget's run, smallest first, each in its own cgroup of that size; with `peer`,
    llama.cpp's run of the same budget (`tokens` x `prompts`) follows Edge0's, in a cgroup of
    its own. Each run starts with the files it reads out of the page cache (`evict`)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="edge0-budget-") as tmp:
        for budget in budgets:
            out = Path(tmp) / f"{budget}.json"
            evict(model_files(model))
            cap = run_capped(inner_command(model, budget, run_args, out), budget, interval)
            report = json.loads(out.read_text()) if out.exists() else None
            rows.append(row(budget, cap, report))
            if peer is not None:
                out = Path(tmp) / f"{budget}-llama.json"
                evict([peer.gguf])
                cap = run_capped(peer.command(out, PROMPT_LEN, tokens, prompts), budget, interval)
                got = json.loads(out.read_text()) if out.exists() else None
                rows[-1]["llama_cpp"] = peer_row(cap, got)
    return rows


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table(rows: list[dict]) -> str:
    """Markdown: one line per budget."""
    lines = [
        "| budget | decode tok/s | compute ms/step | blocked ms/step | MiB read/token | "
        "cgroup peak MiB | peak RSS MiB | limit hits | OOM kills | exit |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    peer = any("llama_cpp" in r for r in rows)
    if peer:
        lines[0] += " llama.cpp tok/s | Edge0 / llama.cpp |"
        lines[1] += "---|---|"
    for r in rows:
        per_token = r["bytes_per_token"] / _MIB if r["bytes_per_token"] is not None else None
        lines.append(
            f"| {r['budget_bytes'] / 2**30:.2f} GiB | {_num(r['decode_tps'], '.2f')} | "
            f"{_num(r['compute_ms_per_step'], '.1f')} | {_num(r['blocked_ms_per_step'], '.1f')} "
            f"| {_num(per_token, '.1f')} | {r['cgroup_peak_bytes'] / _MIB:.0f} | "
            f"{r['peak_rss_bytes'] / _MIB:.0f} | {r['limit_hits']} | {r['oom_kills']} | "
            f"{r['exit']} |"
        )
        if peer:
            theirs = (r.get("llama_cpp") or {}).get("decode_tps")
            ours = r["decode_tps"]
            ratio = ours / theirs if ours is not None and theirs else None
            lines[-1] += f" {_num(theirs, '.3f')} | {_num(ratio, '.2f')} |"
    return "\n".join(lines)


__all__ = ["CapError", "Peer", "check_cgroups", "parse_budgets", "sweep", "table"]
