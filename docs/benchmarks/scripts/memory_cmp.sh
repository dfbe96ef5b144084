#!/bin/bash
# interleaved peak-RSS / CPU comparison of another checkout (BASE) and this one, route K=$2 on
# the 35B shape (Q35: edge0 synth --shape qwen3.5-35b-a3b), $3 tokens, $4 rounds;
# one JSON line per run (docs/memory.md).
#   usage: docs/benchmarks/scripts/memory_cmp.sh Q35 K TOKENS ROUNDS   (BASE=/path/to/other/checkout)
set -eu
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
BASE=${BASE:?set BASE to the checkout to compare with, e.g. a git worktree of main}
for r in $(seq 1 "$4"); do
  for v in base this; do
    if [ $v = base ]; then PP=$BASE; else PP=$ROOT; fi
    out=$(PYTHONPATH=$PP "$PY" "$ROOT/docs/benchmarks/scripts/memory_cmp.py" "$1" "$2" "$3" 2>/dev/null | tail -1)
    echo "{\"round\": $r, \"variant\": \"$v\", \"load\": \"$(cut -d' ' -f1 /proc/loadavg)\", \"res\": $out}"
  done
done
