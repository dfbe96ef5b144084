"""Decode speed of `edge0 serve` with and without a listener on `GET /v1/edge0/events`.

Starts `edge0 serve` (the demo model unless MODEL is given) and sends the same greedy
completion in two variants, interleaved round by round with the order alternating (round 0
warms up and is not counted): `none` (nobody listens: the feed is detached) and `listener`
(one event stream open, read as fast as it comes, from before the request until its `done`
event). Per request, from the server's /metrics: the engine's decode tok/s
(`edge0_decode_tokens_per_second_last`) and the server process's CPU seconds per generated
token. Medians, per-round ratios against `none`, and the load average go into one JSON file,
with the listener's CPU per step measured apart, in one thread (no contention): one request's
steps recorded by the feed in this process, then replayed through the compute thread's side
(the feed's calls) and the event loop's side (summing up per layer and encoding).

Run: python docs/benchmarks/scripts/events_cost.py [MODEL] --rounds 8 --tokens 128 \
        --out docs/benchmarks/results/events-cost.json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from edge0.model.generate import SamplingSettings
from edge0.runtime.compute.live import LiveFeed, StepTrace
from edge0.runtime.engine.sync import SyncEngine
from edge0.server.timeline import Timeline

VARIANTS = ("none", "listener")
PROMPT = "def parse_args(argv):"


def start(args: argparse.Namespace) -> tuple[subprocess.Popen[str], str]:
    """`edge0 serve` on a free port; its URL once it listens."""
    edge0 = str(Path(sys.executable).with_name("edge0"))
    cmd = [edge0, "serve", *([str(args.model)] if args.model else []), "--port", "0"]
    cmd += ["--tiers", args.tiers, "--max-batch", "1"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if m := re.search(r"on (http://127\.0\.0\.1:\d+)/v1", line):
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep it drained
            return proc, m.group(1)
    raise SystemExit(f"edge0 serve exited ({proc.wait()})")


def metrics(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.labels:
                out[s.name] = s.value
    return out


class Listener:
    """One event stream read in a thread until a `done` event; counts what it got."""

    def __init__(self, url: str) -> None:
        self.ready = threading.Event()
        self.events = 0
        self.bytes = 0
        self.thread = threading.Thread(target=self._run, args=(url,), daemon=True)
        self.thread.start()
        if not self.ready.wait(30):
            raise SystemExit("the event stream sent no engine event")

    def _run(self, url: str) -> None:
        with httpx.stream("GET", url + "/v1/edge0/events", timeout=120) as r:
            for line in r.iter_lines():
                self.bytes += len(line) + 1
                if line.startswith("event: "):
                    self.events += 1
                    self.ready.set()
                    if line == "event: done":
                        return


def one(url: str, variant: str, tokens: int) -> dict[str, float]:
    listener = Listener(url) if variant == "listener" else None
    before = metrics(url)
    body = {"prompt": PROMPT, "max_tokens": tokens, "temperature": 0}
    r = httpx.post(url + "/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    after = metrics(url)
    if listener is not None:
        listener.thread.join(30)
    time.sleep(0.5)  # the stream is closed and the feed detached before the next request
    n = r.json()["usage"]["completion_tokens"]
    cpu = after["process_cpu_seconds_total"] - before["process_cpu_seconds_total"]
    return {
        "tokens": n,
        "decode_tps": after["edge0_decode_tokens_per_second_last"],
        "server_cpu_ms_per_token": cpu / n * 1e3,
        "events": listener.events if listener else 0,
        "event_bytes": listener.bytes if listener else 0,
    }


def bench(args: argparse.Namespace, url: str) -> dict[str, Any]:
    rows: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds + 1):  # round 0 warms up
        for variant in VARIANTS if r % 2 else tuple(reversed(VARIANTS)):
            row = one(url, variant, args.tokens)
            print(r, variant, json.dumps(row), file=sys.stderr)
            if r:
                rows[variant].append(row)
    out: dict[str, Any] = {
        "model": args.model.name if args.model else "demo",
        "tiers": args.tiers,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "rows": rows,
    }
    for v in VARIANTS:
        for key in ("decode_tps", "server_cpu_ms_per_token"):
            out[f"{v}_{key}_median"] = statistics.median(x[key] for x in rows[v])
    out["tps_ratio_per_round"] = [
        a["decode_tps"] / b["decode_tps"]
        for a, b in zip(rows["listener"], rows["none"], strict=True)
    ]
    out["tps_ratio_median"] = statistics.median(out["tps_ratio_per_round"])
    out["cpu_ratio_per_round"] = [
        a["server_cpu_ms_per_token"] / b["server_cpu_ms_per_token"]
        for a, b in zip(rows["listener"], rows["none"], strict=True)
    ]
    out["cpu_ratio_median"] = statistics.median(out["cpu_ratio_per_round"])
    return out


def replay(args: argparse.Namespace) -> dict[str, float]:
    """CPU microseconds per step of each side of the feed, replayed in one thread."""
    from edge0.model.demo import default_model_path

    with SyncEngine(args.model or default_model_path(), tiers=args.tiers) as eng:
        setup = eng.engine.setup
        traces: list[StepTrace] = []
        feed = LiveFeed(setup.ctx, setup.tracer, traces.append)
        feed.attach()
        settings = SamplingSettings(max_tokens=args.tokens, temp=0.0)
        c0 = time.process_time()
        list(eng.generate(PROMPT, max_tokens=args.tokens, sampling=settings))
        cpu = (time.process_time() - c0) / args.tokens
        feed.detach()
        decode = [t for t in traces if not t.prefill]
        again = LiveFeed(setup.ctx, setup.tracer, lambda _: None)
        t0 = time.thread_time()
        for t in decode * 5:
            again.begin()
            for kind, layer, start, end in t.spans:
                again.compute(kind, t.step, layer, start, end)
            for ticket in t.reads:
                again.read(ticket)
            again.end()
        t1 = time.thread_time()
        for _ in range(5):
            timeline = Timeline()
            text = json.dumps([timeline.event(t) for t in traces], separators=(",", ":"))
        t2 = time.thread_time()
    return {
        "process_cpu_us_per_token": cpu * 1e6,
        "compute_side_us_per_step": (t1 - t0) / (5 * len(decode)) * 1e6,
        "loop_side_us_per_step": (t2 - t1) / (5 * len(traces)) * 1e6,
        "spans_per_step": sum(len(t.spans) for t in decode) / len(decode),
        "reads_per_step": sum(len(t.reads) for t in decode) / len(decode),
        "event_bytes_per_step": len(text) / len(traces),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", type=Path)
    ap.add_argument("--tiers", default="ram:64MiB>pread")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    load0 = Path("/proc/loadavg").read_text().split()[:3]
    proc, url = start(args)
    try:
        result = bench(args, url)
    finally:
        proc.terminate()
        proc.wait(30)
    result["replay"] = replay(args)
    result["load_before"] = load0
    result["load_after"] = Path("/proc/loadavg").read_text().split()[:3]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))


if __name__ == "__main__":
    main()
