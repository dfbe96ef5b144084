"""What the opt-in int8 activations (EDGE0_INT8_ACTIVATIONS) cost in quality, against the teacher.

For each weight format (affine 4-bit group 64, as `edge0 convert` writes; MXFP4 group 32, as
gpt-oss ships its experts) the teacher is quantized in memory and scored as the
int4-resident row of `edge0 eval quality` (resident routing, true top-k) twice on the same
held-out windows and prompts: native kernels in float32, then with int8 activations.
Routers keep mlx-lm's 8-bit affine quantization in both formats.

Usage: int8_quality.py TEACHER CORPUS OUT.json [--tokens N]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import mlx.nn as nn

from edge0.eval.quality import Variant, evaluate_quality, markdown
from edge0.kernels import native
from edge0.kernels.layers import use_native
from edge0.train.blas import openblas_hint
from edge0.train.fp32 import load_fp32
from edge0.train.traces import corpus_windows

SEQ_LEN, PROMPTS, PROMPT_LEN, GEN_LEN = 128, 8, 32, 32
FORMATS = {"affine int4 g64": ("affine", 64), "mxfp4 g32": ("mxfp4", 32)}


def quantized(teacher: str, mode: str, group: int) -> Any:
    """The teacher at float32, its linears (and experts) quantized to `mode`."""
    s = load_fp32(teacher)
    predicate = getattr(s.model, "quant_predicate", None)

    def pick(path: str, module: nn.Module) -> bool | dict[str, Any]:
        if not hasattr(module, "to_quantized") or module.weight.shape[-1] % group:
            return False
        got = predicate(path, module) if predicate is not None else True
        if isinstance(got, dict):  # mlx-lm's own choice (routers: 8-bit affine)
            return {**got, "mode": "affine"}
        return got

    nn.quantize(s.model, group, 4, mode=mode, class_predicate=pick)
    use_native(s.model)
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("teacher")
    ap.add_argument("corpus")
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=4096)
    args = ap.parse_args()
    if hint := openblas_hint():
        print(hint, file=sys.stderr)
    mod = native.module()
    if mod is None or not mod.has_int8_inputs():
        raise SystemExit(f"no int8 activation path here: {native.status()}")
    t = load_fp32(args.teacher)
    enc = t.tokenizer.encode
    windows = corpus_windows(args.corpus, "heldout", enc, args.tokens // SEQ_LEN, SEQ_LEN + 1)
    prompts = corpus_windows(args.corpus, "heldout", enc, PROMPTS, PROMPT_LEN)
    results: dict[str, Any] = {"status": native.status(), "tokens": int(windows[:, 1:].size)}
    for name, (mode, group) in FORMATS.items():
        s = quantized(args.teacher, mode, group)
        for int8 in (False, True):
            start = time.time()
            mod.set_int8_inputs(int8)
            try:
                r = evaluate_quality(
                    t.model,
                    s.model,
                    [Variant("int4-resident", "resident")],
                    {},
                    4,
                    windows,
                    prompts,
                    GEN_LEN,
                    batch=8,
                )
            finally:
                mod.set_int8_inputs(False)
            key = f"{name}, {'int8' if int8 else 'float32'} activations"
            results[key] = r["rows"][0]
            print(f"{key}: {time.time() - start:.0f} s\n{markdown(r)}\n", flush=True)
    with open(args.out, "w") as fh:
        fh.write(json.dumps(results, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
