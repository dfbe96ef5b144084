"""Load test of `edge0 serve`: concurrent connections of three kinds for a bounded time (loopback).

Starts `edge0 serve --port 0` on the demo model (or uses `--url`, loopback only), then keeps
`--clients` connections busy until `--duration` seconds, split by `--mix NORMAL:SLOW:BAD`:
normal streaming chat requests one after another (a 429 waits its Retry-After and retries),
slowloris (request heads or bodies sent a byte a second: each should end in a 408), and
oversized or malformed requests (Content-Lengths of 20 and 30 digits, a 2 MiB body sent
anyway, a 0.9 MB prompt past the context, UTF-16, broken JSON and HTTP, no API key).
It samples the server's RSS from /metrics every `--rss-every` seconds, waits `--settle`
seconds after the load, and then checks what the server must hold to: no 5xx, no reset,
every 429 with Retry-After, RSS at the end within `--rss-ratio` of its value before the
load, and /metrics counting every answer the clients saw. Prints a markdown report (also to
`--md`), the raw figures to `--json`; exits 1 when a check fails.

Usage: .venv/bin/python tools/bench/serve_load.py --clients 512 --mix 1:1:1 --duration 600
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).parent))
from serve_clients import Tally, bad, normal, slowloris  # noqa: E402

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
KEY = "serve-load-key"
OWN_ROUTES = ("/metrics", "/health")  # the tool's own probes: not part of the load


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-c", "from edge0.cli.main import main; main()", "serve"]
    cmd += ["--port", "0", "--api-key", KEY, *shlex.split(args.serve_args)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if m := re.search(r"on (http://\S+)/v1", line):
            return proc, m.group(1)
    raise SystemExit(f"edge0 serve exited with {proc.wait()}")


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


async def rss_mib(client: httpx.AsyncClient, url: str) -> float:
    text = (await client.get(f"{url}/metrics")).text
    return samples(text, "process_resident_memory_bytes")[0][1] / 2**20


async def load(url: str, args: argparse.Namespace) -> dict[str, Any]:
    weights = [int(w) for w in args.mix.split(":")]
    counts = [args.clients * w // sum(weights) for w in weights]
    counts[0] += args.clients - sum(counts)
    tallies = {kind: Tally() for kind in ("normal", "slowloris", "bad")}
    headers = {"Authorization": f"Bearer {KEY}"}
    limits = httpx.Limits(max_connections=counts[0] + 4, keepalive_expiry=4.0)
    timeout = httpx.Timeout(args.duration + 300)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, headers=headers) as client:
        cold = await rss_mib(client, url)
        warm = Tally()  # a full batch: the engine's working set for --max-batch requests
        await asyncio.gather(
            *(normal(client, url, time.monotonic() + 0.1, warm) for _ in range(args.warm))
        )
        await asyncio.sleep(args.settle)
        before = await rss_mib(client, url)
        rss: list[tuple[float, float]] = [(0.0, before)]
        t0 = time.monotonic()
        deadline = t0 + args.duration

        async def sample() -> None:
            while time.monotonic() < deadline:
                await asyncio.sleep(args.rss_every)
                rss.append((time.monotonic() - t0, await rss_mib(client, url)))

        jobs = [normal(client, url, deadline, tallies["normal"]) for _ in range(counts[0])]
        jobs += [slowloris(url, KEY, deadline, tallies["slowloris"]) for _ in range(counts[1])]
        jobs += [bad(url, KEY, deadline, tallies["bad"], args.bad_pause) for _ in range(counts[2])]
        sampler = asyncio.ensure_future(sample())
        await asyncio.gather(*jobs)
        wall = time.monotonic() - t0
        sampler.cancel()
        await asyncio.sleep(args.settle)  # idle: the server trims its heap
        after = await rss_mib(client, url)
        rss.append((time.monotonic() - t0, after))
        metrics = (await client.get(f"{url}/metrics")).text
    seen = collections.Counter(warm.status)
    for tally in tallies.values():
        seen.update(tally.status)
    counted: collections.Counter[int] = collections.Counter()
    for labels, value in samples(metrics, "edge0_http_responses_total"):
        if labels["route"] not in OWN_ROUTES:
            counted[int(labels["status"])] += int(value)
    normal_t = tallies["normal"]
    return {
        "clients": dict(zip(("normal", "slowloris", "bad"), counts, strict=True)),
        "duration_s": wall,
        "kinds": {k: t.summary() for k, t in tallies.items()},
        "ttft_p50_s": pct(normal_t.ttft, 0.5),
        "ttft_p99_s": pct(normal_t.ttft, 0.99),
        "rss_cold_mib": cold,
        "rss_before_mib": before,
        "rss_peak_mib": max(v for _, v in rss),
        "rss_after_mib": after,
        "rss_mib": rss,
        "seen": dict(sorted(seen.items())),
        "counted": dict(sorted(counted.items())),
        "refused": {
            labels["reason"]: int(v) for labels, v in samples(metrics, "edge0_refused_total")
        },
        "loadavg": os.getloadavg(),
        "warm": args.warm,
        "settle_s": args.settle,
    }


def checks(res: dict[str, Any], ratio: float) -> list[str]:
    """What failed (empty: all held)."""
    failed = []
    for kind, summary in res["kinds"].items():
        server_errors = sum(n for s, n in summary["status"].items() if s >= 500)
        if server_errors:
            failed.append(f"{kind}: {server_errors} answers of 5xx")
        if summary["resets"]:
            failed.append(f"{kind}: {summary['resets']} resets, e.g. {summary['reset_samples']}")
        if summary["retry_after_missing"]:
            failed.append(f"{kind}: {summary['retry_after_missing']} 429s without Retry-After")
    if res["rss_after_mib"] > ratio * res["rss_before_mib"]:
        failed.append(f"RSS {res['rss_before_mib']:.0f} -> {res['rss_after_mib']:.0f} MiB")
    if res["seen"] != res["counted"]:
        failed.append(f"/metrics counted {res['counted']}, the clients saw {res['seen']}")
    return failed


def markdown(res: dict[str, Any], command: str, failed: list[str]) -> str:
    la = ", ".join(f"{x:.1f}" for x in res["loadavg"])
    rows = [
        f"| {kind} | {res['clients'][kind]} | {sum(s['status'].values())} | "
        + ", ".join(f"{k}: {v}" for k, v in s["status"].items())
        + f" | {s['resets']} |"
        for kind, s in res["kinds"].items()
    ]
    step = max(1, len(res["rss_mib"]) // 12)
    trace = ", ".join(f"{t:.0f}s {v:.0f}" for t, v in res["rss_mib"][::step])
    return "\n".join(
        [
            f"Command: `{command}`",
            "",
            f"{sum(res['clients'].values())} concurrent connections for "
            f"{res['duration_s']:.0f} s on loopback; load average at the end: {la}.",
            "",
            "| clients | connections | answers | by status | resets |",
            "|---|---|---|---|---|",
            *rows,
            "",
            f"Normal requests: {res['kinds']['normal']['completed']} streamed to the end; "
            f"time to first token p50 {res['ttft_p50_s']:.2f} s, p99 {res['ttft_p99_s']:.2f} s "
            "(queue wait included; a 429's retry is a new request).",
            "",
            f"RSS (MiB): {res['rss_cold_mib']:.0f} at start, {res['rss_before_mib']:.0f} before "
            f"the load (after {res['warm']} requests at once: the engine's batch working set), "
            f"{res['rss_peak_mib']:.0f} at the peak, {res['rss_after_mib']:.0f} after "
            f"{res['settle_s']:g} s idle (ratio {res['rss_after_mib'] / res['rss_before_mib']:.2f}"
            f" to before the load). Over time: {trace}.",
            "",
            f"/metrics, every answer (its own probes aside) by status: {res['counted']}; the "
            f"clients saw {res['seen']}. Refusals by reason: {res['refused']}.",
            "",
            "Checks: " + ("all held." if not failed else "FAILED: " + "; ".join(failed)),
            "",
        ]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=512, help="concurrent connections")
    p.add_argument("--mix", default="1:1:1", help="NORMAL:SLOWLORIS:BAD weights")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load (bounded)")
    p.add_argument("--bad-pause", type=float, default=1.0, help="seconds between bad requests")
    p.add_argument("--rss-every", type=float, default=10.0)
    p.add_argument("--rss-ratio", type=float, default=1.3)
    p.add_argument("--settle", type=float, default=10.0, help="idle seconds before RSS reads")
    p.add_argument("--warm", type=int, default=4, help="requests at once before the baseline")
    p.add_argument("--url", default=None, help="a running server (loopback; key: " + KEY + ")")
    p.add_argument("--serve-args", default="", help="extra `edge0 serve` arguments")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--md", type=Path, default=None)
    args = p.parse_args()
    if args.url and urlparse(args.url).hostname not in LOOPBACK:
        raise SystemExit("--url must be a loopback address (this is a load generator)")
    command = " ".join(shlex.quote(a) for a in [".venv/bin/python", *sys.argv])
    proc, url = (None, args.url) if args.url else start_server(args)
    try:
        res = asyncio.run(load(url.rstrip("/"), args))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)
    failed = checks(res, args.rss_ratio)
    text = markdown(res, command, failed)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"command": command, **res, "failed": failed}, indent=1))
    if args.md:
        args.md.write_text(text)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
