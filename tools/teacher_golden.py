"""Golden logits for the shipped teacher: transformers fp32, fixed prompt, 8 cached decode steps.

Writes tests/fixtures/teacher_golden.npz with:
    prompt_ids (T,), last_logits (V,) = logits at the prompt's last position,
    decode_ids (8,), decode_logits (8, V) = logits after feeding decode_ids[i],
    greedy_ids (<= GREEDY_TOKENS,) = greedy continuation, stopping before end-of-text.
Needs torch (the `train` extra). Usage:

    .venv/bin/python tools/teacher_golden.py [--model edge0/data/teacher]
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import click
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TEACHER = ROOT / "edge0" / "data" / "teacher"
TARGET = ROOT / "tests" / "fixtures" / "teacher_golden.npz"
PROMPT = "def fibonacci(n):\n"
GREEDY_TOKENS = 32


def golden_tool() -> Any:
    """tools/golden_logits.py (the fixtures' reference runner), imported by path."""
    spec = importlib.util.spec_from_file_location(
        "golden_logits", ROOT / "tools" / "golden_logits.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prompt_ids(model: Path) -> list[int]:
    from tokenizers import Tokenizer

    return list(Tokenizer.from_file(str(model / "tokenizer.json")).encode(PROMPT).ids)


def reference(model: Path) -> dict[str, np.ndarray]:
    """Last-position + decode logits (float32) and the greedy continuation, from transformers."""
    tool = golden_tool()
    ids = prompt_ids(model)
    ref = tool.reference_logits(model, ids)
    return {
        "prompt_ids": ref["prompt_ids"],
        "last_logits": ref["prefill_logits"][-1].astype(np.float32),
        "decode_ids": ref["decode_ids"],
        "decode_logits": ref["decode_logits"].astype(np.float32),
        "greedy_ids": greedy(tool.reference_model(model), ids, eos_id(model)),
    }


def eos_id(model: Path) -> int:
    import json

    return int(json.loads((model / "config.json").read_text())["eos_token_id"])


def greedy(model: Any, ids: list[int], eos: int) -> np.ndarray:
    """GREEDY_TOKENS greedy tokens through transformers' cache (end-of-text not included)."""
    import torch

    out_ids: list[int] = []
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        for _ in range(GREEDY_TOKENS):
            token = int(out.logits[0, -1].argmax())
            if token == eos:
                break
            out_ids.append(token)
            cache = out["cache"] if "cache" in out else out["past_key_values"]
            out = model(torch.tensor([[token]]), cache=cache, use_cache=True)
    return np.array(out_ids, dtype=np.int64)


@click.command()
@click.option("--model", type=click.Path(path_type=Path), default=TEACHER)
@click.option("--out", type=click.Path(path_type=Path), default=TARGET)
def main(model: Path, out: Path) -> None:
    result = reference(model)
    arrays: dict[str, Any] = dict(result)
    np.savez_compressed(out, **arrays)
    from tokenizers import Tokenizer

    text = Tokenizer.from_file(str(model / "tokenizer.json")).decode(result["greedy_ids"].tolist())
    click.echo(
        f"{out}: prompt {result['prompt_ids'].tolist()}, decode {result['decode_ids'].tolist()}"
    )
    click.echo(f"greedy: {PROMPT!r} + {text!r}")


if __name__ == "__main__":
    main()
