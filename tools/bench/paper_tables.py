"""Reproduce the benchmark results in docs/benchmarks/: each step is one `edge0 bench` command.

    python tools/bench/paper_tables.py [--medium MEDIUM] [--q35 Q35]
        [--only modes,k,sweep,cold,35b] [--dry-run]

Steps (each writes docs/benchmarks/results/<name>.json, a page docs/benchmarks/<page>.md
and PNGs under docs/benchmarks/img/<name>/):
  modes  resident / reactive / hint / route at K=4 on the medium synthetic model, through a
         throttle calibrated so reactive's reads per step take as long as its compute;
  k      reactive vs route at K=2, 4, 8 on the same throttle;
  sweep  decode tok/s against emulated bandwidth 0.1-3.2 GB/s, reactive and route, with the
         resident (no reads) and unthrottled-route bounds;
  cold   reactive vs route on this machine's own disk (no throttle), page cache dropped
         before each measured prompt (pread) or bypassed (direct, O_DIRECT): tiers.md;
  35b    the qwen3.5-35b-a3b shape: route K=4 under --memory-budget 3GiB, then resident on
         the same machine, watched by the memory guard (35b.md is written by hand from
         results/35b-*.md).
Models: MEDIUM and Q35 (`edge0 synth --shape medium MEDIUM`, `--shape
qwen3.5-35b-a3b Q35`; `edge0 verify` them first); by default under the cache directory
($EDGE0_CACHE or ~/.cache/edge0) in synth/medium and synth/qwen3.5-35b-a3b.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "benchmarks"
RESULTS = DOCS / "results"
SMALL_RUN = ["--prompts", "1", "--prompt-len", "8", "--tokens", "16", "--warmup-tokens", "4"]
Q35_RUN = [
    "--prompts",
    "1",
    "--prompt-len",
    "4",
    "--tokens",
    "6",
    "--warmup-tokens",
    "1",
    "--repeats",
    "1",
]


def steps(calibrated: str, medium: str, q35: str) -> dict[str, list[list[str]]]:
    """name -> the edge0 argument lists it runs (outputs named after the step)."""

    def out(name: str, page: Path | None = None) -> list[str]:
        md = page or RESULTS / f"{name}.md"
        return [
            "--json",
            str(RESULTS / f"{name}.json"),
            "--md",
            str(md),
            "--plot",
            str(DOCS / "img" / name),
        ]

    return {
        "modes": [
            [
                "bench",
                "run",
                medium,
                "--modes",
                "resident,reactive,hint,route",
                "--top-k",
                "4",
                "--io-ratio",
                "1.0",
                "--repeats",
                "5",
                *SMALL_RUN,
                *out("modes", DOCS / "modes.md"),
            ]
        ],
        "k": [
            [
                "bench",
                "run",
                medium,
                "--modes",
                "reactive,route",
                "--top-k",
                "2,4,8",
                "--tiers",
                calibrated,
                "--repeats",
                "2",
                *SMALL_RUN,
                *out("k", DOCS / "k.md"),
            ]
        ],
        "sweep": [
            [
                "bench",
                "sweep",
                medium,
                "--top-k",
                "4",
                "--bounds",
                "resident,route",
                "--repeats",
                "3",
                *SMALL_RUN,
                *out("sweep", DOCS / "sweep.md"),
            ]
        ],
        "cold": [
            [
                "bench",
                "run",
                medium,
                "--modes",
                "reactive,route",
                "--top-k",
                "4",
                "--tiers",
                "pread",
                "--tiers",
                "direct",
                "--cold",
                "--repeats",
                "2",
                *SMALL_RUN,
                *out("cold", DOCS / "tiers.md")[:4],
            ]
        ],
        "35b": [
            [
                "bench",
                "run",
                q35,
                "--modes",
                "route",
                "--top-k",
                "4",
                "--memory-budget",
                "3GiB",
                "--first-layer",
                "wrap",
                "--tiers",
                "ram>direct",
                *Q35_RUN,
                *out("35b-route-planfix")[:4],
            ],
            [
                "bench",
                "run",
                q35,
                "--modes",
                "resident",
                "--top-k",
                "4",
                "--timeout",
                "600",
                "--mem-floor",
                "1.5GiB",
                *Q35_RUN,
                *out("35b-resident")[:4],
            ],
        ],
    }


def calibrated_spec() -> str:
    """The throttle stack the `modes` step calibrated (read back from its JSON)."""
    import json

    path = RESULTS / "modes.json"
    if not path.is_file():
        sys.exit("run the `modes` step first: the `k` step reuses its calibrated throttle")
    labels = [v["tiers"] for v in json.loads(path.read_text())["variants"]]
    return next(t for t in labels if t.startswith("throttle:"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    from edge0.model.demo import cache_dir

    synth = cache_dir() / "synth"
    ap.add_argument("--medium", default=str(synth / "medium"), help="the medium synthetic model")
    ap.add_argument("--q35", default=str(synth / "qwen3.5-35b-a3b"), help="the 35B-shape one")
    ap.add_argument("--only", default="modes,k,sweep,cold,35b")
    ap.add_argument("--dry-run", action="store_true", help="Print the commands only.")
    args = ap.parse_args()
    edge0 = str(Path(sys.executable).parent / "edge0")
    (DOCS / "img").mkdir(parents=True, exist_ok=True)
    for name in args.only.split(","):
        spec = calibrated_spec() if name == "k" and not args.dry_run else "<from modes.json>"
        for cmd in steps(spec, args.medium, args.q35)[name]:
            print("$ " + shlex.join(["edge0", *cmd]), flush=True)
            if not args.dry_run:
                subprocess.run([edge0, *cmd], check=True, cwd=ROOT)


if __name__ == "__main__":
    main()
