"""Held-out recall@K of several sets of heads on the same held-out traces of `edge0 tune`.

    python docs/benchmarks/scripts/tune_recall.py WORK_DIR LAYOUT_A [LAYOUT_B ...]
        [--k K] [--json OUT]

WORK_DIR is a tune run's `--work-dir` (its `heldout/` traces: the int4 model's own routing
on held-out text); each LAYOUT's token heads (`prerouter.safetensors`) are scored on the
same rows, beside the untrained rule (the next router on this layer's hidden) and the
"same experts as the last token" rule. docs/benchmarks/tune.md compares the demo's shipped
heads (trained on fp32-teacher traces) with the heads `edge0 tune` trained from streamed
int4 traces.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from edge0.layout.load import load_layout
from edge0.routing.prerouter import PrerouterSet
from edge0.tune.store import Shape, TraceStore
from edge0.tune.validate import head_recall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("work_dir", type=Path)
    ap.add_argument("layouts", type=Path, nargs="+")
    ap.add_argument("--k", type=int, default=None, help="capacity K [default: the model's]")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    root = a.work_dir / "heldout"
    state = json.loads((root / "state.json").read_text())
    shape = Shape(**{**state["shape"], "moe_layers": tuple(state["shape"]["moe_layers"])})
    held = TraceStore.open(root, shape, state["key"]).trace_set("student-int4 (streamed)", "")
    k = a.k or shape.top_k
    rows: dict[str, dict[str, object]] = {}
    init = PrerouterSet.from_model(load_layout(a.layouts[0], experts="none").model)
    rows["untrained (next router)"] = head_recall(init, held, k)
    for layout in a.layouts:
        heads = PrerouterSet.load(layout)
        source = heads.config.info.get("traces", {}).get("source", "?")
        rows[f"{layout} ({source} traces)"] = head_recall(heads, held, k)
    print(f"held-out recall@{k} on {held.meta.windows} windows x {held.meta.seq_len} tokens")
    for name, r in rows.items():
        last = f"same experts as the last token: {r['temporal_recall']:.4f}"
        print(f"  {name}: {r['recall']:.4f} ({last})")
    if a.json is not None:
        a.json.write_text(json.dumps({"k": k, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
