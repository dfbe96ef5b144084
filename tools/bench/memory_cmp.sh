#!/bin/bash
# interleaved peak-RSS / CPU comparison of main (/work/main) and this checkout, route K=$1 on the
# 35B shape, $2 tokens, $3 rounds; one JSON line per run (docs/memory.md)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
for r in $(seq 1 "$3"); do
  for v in main memory; do
    if [ $v = main ]; then PP=/work/main; else PP=$ROOT; fi
    out=$(PYTHONPATH=$PP "$PY" "$ROOT/tools/bench/memory_cmp.py" /work/scratch/synth/qwen35-35b-a3b "$1" "$2" 2>/dev/null | tail -1)
    echo "{\"round\": $r, \"variant\": \"$v\", \"load\": \"$(cut -d' ' -f1 /proc/loadavg)\", \"res\": $out}"
  done
done
