"""The int4-resident row of `edge0 eval quality` for several conversions of one teacher."""

from __future__ import annotations

import json
import sys
import time

from edge0.eval.quality import Variant, evaluate_quality, markdown
from edge0.train.fp32 import load_pair
from edge0.train.traces import corpus_windows

TOKENS, SEQ_LEN, PROMPTS, PROMPT_LEN, GEN_LEN = 4096, 128, 8, 32, 32


def main() -> None:
    """Usage: resident_quality.py TEACHER CORPUS OUT.json DIR [DIR ...]."""
    teacher, corpus, out, *dirs = sys.argv[1:]
    results = {}
    for d in dirs:
        start = time.time()
        t, s = load_pair(d, teacher)
        enc = s.tokenizer.encode
        windows = corpus_windows(corpus, "heldout", enc, TOKENS // SEQ_LEN, SEQ_LEN + 1)
        prompts = corpus_windows(corpus, "heldout", enc, PROMPTS, PROMPT_LEN)
        variants = [Variant("int4-resident", "resident")]
        r = evaluate_quality(t.model, s.model, variants, {}, 4, windows, prompts, GEN_LEN, batch=8)
        results[d] = r
        sys.stdout.write(f"{d} {time.time() - start:.0f} s\n{markdown(r)}\n")
    with open(out, "w") as fh:
        fh.write(json.dumps(results, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
