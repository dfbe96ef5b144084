"""PNG plots of benchmark results: read-vs-compute timeline, bar charts, the SSD-speed sweep
(matplotlib, optional: `pip install 'edge0[plot]'`, imported on first use).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edge0.errors import ConfigError

_MIB = 1 << 20
COLORS = {
    "eval": "#4c72b0",
    "partial": "#3b5e91",
    "predict": "#8172b2",
    "wait": "#c44e52",
    "sample": "#64b5cd",
    "demand": "#dd8452",
    "prefetch": "#55a868",
}


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ConfigError(
            "plots need matplotlib; install it with pip install 'edge0[plot]' or drop --plot"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def last_steps(trace: dict[str, Any], steps: int) -> tuple[list[dict], list[dict], float, float]:
    """Compute spans and reads of the last `steps` steps of a Chrome trace; window in ms."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    compute = [e for e in events if e["cat"].startswith("compute.")]
    if not compute:
        raise ConfigError("the trace has no compute spans")
    chosen = sorted({e["args"]["step"] for e in compute})[-steps:]
    spans = [e for e in compute if e["args"]["step"] in chosen]
    t0 = min(e["ts"] for e in spans)
    t1 = max(e["ts"] + e["dur"] for e in spans)
    reads = [
        e
        for e in events
        if e["cat"].startswith("read.") and e["ts"] + e["dur"] > t0 and e["ts"] < t1
    ]
    return spans, reads, t0 / 1e3, t1 / 1e3


def timeline(traces: dict[str, Path], out: Path, steps: int = 3) -> Path:
    """One panel per trace: the compute track (eval / predict / wait) over tier-worker reads."""
    plt = _pyplot()
    fig, axes = plt.subplots(len(traces), 1, figsize=(11, 1.2 + 1.3 * len(traces)), squeeze=False)
    for ax, (label, path) in zip(axes[:, 0], traces.items(), strict=True):
        spans, reads, t0, t1 = last_steps(json.loads(Path(path).read_text()), steps)
        workers = sorted({e["tid"] for e in reads})
        rows = ["compute"] + [f"reader {w - 1}" for w in workers]
        for e in spans:
            kind = e["cat"].split(".", 1)[1]
            ax.broken_barh(
                [(e["ts"] / 1e3 - t0, e["dur"] / 1e3)],
                (0.6, 0.8),
                color=COLORS.get(kind, "grey"),
                linewidth=0,
            )
        for e in reads:
            row = 1 + workers.index(e["tid"])
            kind = e["cat"].split(".", 1)[1]
            ax.broken_barh(
                [(e["ts"] / 1e3 - t0, e["dur"] / 1e3)],
                (row + 0.6, 0.8),
                color=COLORS.get(kind, "grey"),
                edgecolor="white",
                linewidth=0.3,
            )
        starts: dict[int, float] = {}
        for e in spans:
            step = e["args"]["step"]
            starts[step] = min(starts.get(step, e["ts"]), e["ts"])
        for ts in starts.values():  # step boundaries
            ax.axvline(ts / 1e3 - t0, color="black", linewidth=0.6, linestyle=":")
        ax.set_yticks([i + 1 for i in range(len(rows))], rows)
        ax.set_ylim(0.4, len(rows) + 0.6)
        ax.set_xlim(0, t1 - t0)
        ax.invert_yaxis()
        ax.set_title(f"{label}: last {steps} steps", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("ms")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    fig.legend(handles, list(COLORS), loc="upper right", ncol=6, fontsize=7)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def bars(report: dict[str, Any], out: Path) -> Path:
    """Decode tok/s (median, min-max whiskers), blocked-load ms/step and MiB/token per variant."""
    plt = _pyplot()
    rows = [v for v in report["variants"] if v.get("runs_ok")]
    stacks = {v["tiers"] for v in rows if v["mode"] != "resident"}
    if len(stacks) == 1:  # one tier stack: name it once, in the title
        labels = [v["label"].split(" @ ")[0] for v in rows]
    else:
        labels = [v["label"].replace(" @ ", "\n") for v in rows]
    fig, axes = plt.subplots(1, 3, figsize=(4 + 1.6 * len(rows), 4.2))
    x = list(range(len(rows)))
    med = [v["median"]["decode_tps"] for v in rows]
    err = [
        [m - v["min"]["decode_tps"] for m, v in zip(med, rows, strict=True)],
        [v["max"]["decode_tps"] - m for m, v in zip(med, rows, strict=True)],
    ]
    panels = [
        ("decode tok/s (median, min-max)", med, err),
        ("blocked load ms/step", [v["median"]["blocked_ms_per_step"] for v in rows], None),
        ("MiB read per token", [v["median"]["bytes_per_token"] / _MIB for v in rows], None),
    ]
    for ax, (title, values, yerr) in zip(axes, panels, strict=True):
        ax.bar(x, values, yerr=yerr, capsize=3, color="#4c72b0")
        ax.set_xticks(x, labels, fontsize=6, rotation=30, ha="right")
        ax.set_title(title, fontsize=9)
    if len(stacks) == 1:
        fig.suptitle(f"tiers: {stacks.pop()}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def sweep_plot(
    points: dict[str, list[tuple[float, float, float, float]]],
    bounds: dict[str, float],
    out: Path,
    title: str = "",
) -> Path:
    """Decode tok/s against bandwidth (GB/s, log axis), one line per mode, bounds dashed.

    points: mode -> [(GB/s, median tok/s, min, max)]; bounds: label -> tok/s.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode, pts in points.items():
        pts = sorted(pts)
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts]
        err = [[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=mode)
    styles = iter(["--", ":", "-."])
    for label, value in bounds.items():
        ax.axhline(value, linestyle=next(styles, "--"), color="grey", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("emulated storage bandwidth, GB/s (throttle tier)")
    ax.set_ylabel("decode tok/s (median, min-max)")
    return _tok_s_axes(plt, fig, ax, title, out)


def _tok_s_axes(plt: Any, fig: Any, ax: Any, title: str, out: Path) -> Path:
    """A tok/s plot's common finish (from zero, titled, gridded, legend), saved to `out`."""
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def budget_plot(rows: list[dict[str, Any]], out: Path, title: str = "") -> Path:
    """Decode tok/s against the memory budget (GiB; edge0.bench.budget's rows), llama.cpp's
    beside Edge0's where the rows have it; runs without a figure are left out."""
    plt = _pyplot()
    pts = [(r["budget_bytes"] / 2**30, r["decode_tps"]) for r in rows if r["decode_tps"]]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label="edge0")
    peer = [
        (r["budget_bytes"] / 2**30, r["llama_cpp"]["decode_tps"])
        for r in rows
        if (r.get("llama_cpp") or {}).get("decode_tps")
    ]
    if peer:
        ax.plot([p[0] for p in peer], [p[1] for p in peer], marker="s", label="llama.cpp")
    ax.set_xlabel("memory budget = cgroup limit, GiB (page cache counted)")
    ax.set_ylabel("decode tok/s (median)")
    return _tok_s_axes(plt, fig, ax, title, out)
