"""Load test of `edge0 serve`: N concurrent streaming chat clients for a bounded time, on loopback.

Starts `edge0 serve --port 0` on the demo model (or uses `--url`, loopback only),
then runs `--clients` clients, each sending streamed chat completions one after
another until `--duration` seconds or `--max-requests` in all. It measures per
request the time to the first text (TTFT) and the gaps between text chunks
(inter-token latency; one SSE chunk per detokenized piece), counts errors, and
samples the server's RSS from /metrics every `--rss-every` seconds. Prints a
markdown table and writes it (with the command) to `--md`, the raw figures to
`--json`.

Usage: .venv/bin/python tools/bench/serve_load.py [--clients 8] [--duration 180]
           [--max-tokens 32] [--md docs/benchmarks/serve.md]
           [--json docs/benchmarks/results/serve.json]
"""

from __future__ import annotations

import argparse
import asyncio
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

PROMPTS = [
    "def parse_args(argv):",
    "class LRUCache:",
    "import os\nimport sys\n",
    "def read_config(path):",
    "# Tokenize the input",
    "async def fetch(url):",
    "def test_roundtrip():",
    "class Node:\n    def __init__(self",
]
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[str], str]:
    cmd = [
        sys.executable,
        "-c",
        "from edge0.cli.main import main; main()",
        "serve",
        "--port",
        "0",
        *shlex.split(args.serve_args),
    ]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if m := re.search(r"on (http://\S+)/v1", line):
            return proc, m.group(1)
    raise SystemExit(f"edge0 serve exited with {proc.wait()}")


async def one_request(client: httpx.AsyncClient, url: str, i: int, args: Any) -> dict[str, Any]:
    body = {
        "model": "edge0-demo",
        "max_tokens": args.max_tokens,
        "temperature": 0.7,
        "seed": i,
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
    }
    t0 = time.perf_counter()
    stamps: list[float] = []
    tokens, error = 0, None
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                return {"error": f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"}
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    error = chunk["error"]["message"]
                elif chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                elif chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    stamps.append(time.perf_counter())
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
    if error or not stamps:
        return {"error": error or "no text"}
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return {
        "ttft": stamps[0] - t0,
        "gaps": gaps,
        "tokens": tokens,
        "seconds": time.perf_counter() - t0,
    }


async def load(url: str, args: argparse.Namespace) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    rss: list[tuple[float, float]] = []
    counter = iter(range(args.max_requests))
    t0 = time.perf_counter()
    deadline = t0 + args.duration
    headers = {"Authorization": f"Bearer {os.environ.get('EDGE0_API_KEY', 'none')}"}

    async def client_loop(client: httpx.AsyncClient) -> None:
        while time.perf_counter() < deadline and (i := next(counter, None)) is not None:
            results.append(await one_request(client, url, i, args))

    async def sample_rss(client: httpx.AsyncClient) -> None:
        while time.perf_counter() < deadline:
            text = (await client.get(f"{url}/metrics")).text
            m = re.search(r"^process_resident_memory_bytes (\S+)$", text, re.M)
            if m:
                rss.append((time.perf_counter() - t0, float(m.group(1)) / 2**20))
            await asyncio.sleep(args.rss_every)

    timeout = httpx.Timeout(args.duration + 120)
    limits = httpx.Limits(max_connections=args.clients + 2)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, headers=headers) as client:
        sampler = asyncio.create_task(sample_rss(client))
        await asyncio.gather(*(client_loop(client) for _ in range(args.clients)))
        sampler.cancel()
        text = (await client.get(f"{url}/metrics")).text
    wall = time.perf_counter() - t0
    ok = [r for r in results if "error" not in r]
    errors = [r["error"] for r in results if "error" in r]
    gaps = [g for r in ok for g in r["gaps"]]
    tokens = sum(r["tokens"] for r in ok)
    return {
        "clients": args.clients,
        "max_tokens": args.max_tokens,
        "wall_s": wall,
        "requests": len(results),
        "errors": len(errors),
        "error_samples": errors[:5],
        "tokens": tokens,
        "tok_per_s": tokens / wall,
        "ttft_p50_s": pct([r["ttft"] for r in ok], 0.5),
        "ttft_p99_s": pct([r["ttft"] for r in ok], 0.99),
        "itl_p50_ms": pct(gaps, 0.5) * 1e3,
        "itl_p99_ms": pct(gaps, 0.99) * 1e3,
        "request_p50_s": pct([r["seconds"] for r in ok], 0.5),
        "rss_mib": rss,
        "server_metrics_tail": [
            ln for ln in text.splitlines() if ln.startswith("edge0_requests_total")
        ],
        "loadavg": os.getloadavg(),
    }


def rss_summary(rss: list[tuple[float, float]]) -> tuple[float, float, float, float]:
    """First sample after the first minute (warm), last, max, and slope in MiB/min after it."""
    warm = [s for s in rss if s[0] >= 60] or rss
    (t_a, a), (t_b, b) = warm[0], warm[-1]
    slope = (b - a) / ((t_b - t_a) / 60) if t_b > t_a else 0.0
    return a, b, max(v for _, v in rss), slope


def markdown(res: dict[str, Any], command: str) -> str:
    a, b, top, slope = rss_summary(res["rss_mib"])
    step = max(1, len(res["rss_mib"]) // 12)
    trace = ", ".join(f"{t:.0f}s {v:.0f}" for t, v in res["rss_mib"][::step])
    la = ", ".join(f"{x:.1f}" for x in res["loadavg"])
    return "\n".join(
        [
            "# `edge0 serve` under load",
            "",
            f"Command: `{command}`",
            "",
            f"{res['clients']} concurrent streaming chat clients (max_tokens {res['max_tokens']}, "
            f"temperature 0.7, one request after another each) against `edge0 serve` on the demo "
            "model (route mode, default tiers `ram:1GiB>pread`), loopback only, for "
            f"{res['wall_s']:.0f} s. 2-core x86-64 Linux CPU, shared; load average at the "
            f"end: {la}.",
            "",
            "| clients | requests | errors | tokens | aggregate tok/s | TTFT p50 / p99 (s) | "
            "inter-token p50 / p99 (ms) | request p50 (s) | RSS warm -> end (max), MiB | "
            "RSS slope after 1 min |",
            "|---|---|---|---|---|---|---|---|---|---|",
            f"| {res['clients']} | {res['requests']} | {res['errors']} | {res['tokens']} | "
            f"{res['tok_per_s']:.1f} | {res['ttft_p50_s']:.2f} / {res['ttft_p99_s']:.2f} | "
            f"{res['itl_p50_ms']:.1f} / {res['itl_p99_ms']:.1f} | {res['request_p50_s']:.2f} | "
            f"{a:.0f} -> {b:.0f} ({top:.0f}) | {slope:+.2f} MiB/min |",
            "",
            f"RSS over time (MiB): {trace}.",
            "",
            "The engine serves requests one at a time, first come first served (batched decode",
            "is a later issue), so with N clients a request waits for about N-1 others: TTFT is",
            "mostly queueing, while the inter-token gap is one decode step. Server counters at",
            "the end: " + "; ".join(f"`{ln}`" for ln in res["server_metrics_tail"]) + ".",
            "",
        ]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--duration", type=float, default=180.0, help="seconds of load (bounded)")
    p.add_argument("--max-requests", type=int, default=2000, help="requests in all (bounded)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--rss-every", type=float, default=5.0)
    p.add_argument("--url", default=None, help="a running server (loopback only)")
    p.add_argument("--serve-args", default="", help="extra `edge0 serve` arguments")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--md", type=Path, default=None)
    args = p.parse_args()
    if args.url and urlparse(args.url).hostname not in LOOPBACK:
        raise SystemExit("--url must be a loopback address (this is a load generator)")
    command = " ".join(shlex.quote(a) for a in [".venv/bin/python", *sys.argv])
    proc = None
    url = args.url
    if url is None:
        proc, url = start_server(args)
    try:
        res = asyncio.run(load(url.rstrip("/"), args))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    text = markdown(res, command)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"command": command, **res}, indent=1))
    if args.md:
        args.md.write_text(text)
    sys.exit(1 if res["errors"] else 0)


if __name__ == "__main__":
    main()
