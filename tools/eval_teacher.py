"""Held-out perplexity of the teacher: transformers fp32, MLX fp32 and MLX int4 (router kept)."""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / "edge0" / "data" / "teacher"

# (n, ctx + 1) int64 windows -> summed next-token NLL (nats) over the batch
NllFn = Callable[[np.ndarray], float]


def heldout_windows(model_dir: Path, heldout: Path, ctx: int, limit: int | None) -> np.ndarray:
    """Non-overlapping (n, ctx + 1) windows over the held-out split, as in training."""
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    ids = np.asarray(tok.encode(heldout.read_text(encoding="utf-8")).ids, dtype=np.int64)
    n = (len(ids) - 1) // ctx
    if limit is not None:
        n = min(n, limit)
    return np.stack([ids[i * ctx : i * ctx + ctx + 1] for i in range(n)])  # (n, ctx + 1)


def perplexity(nll: NllFn, windows: np.ndarray, batch: int, desc: str) -> dict[str, float]:
    """exp(mean NLL) over every target token of the windows."""
    total, start = 0.0, time.perf_counter()
    for i in tqdm(range(0, len(windows), batch), desc=desc, leave=False):
        total += nll(windows[i : i + batch])
    loss = total / windows[:, 1:].size
    return {
        "loss": round(loss, 4),
        "ppl": round(math.exp(loss), 3),
        "seconds": round(time.perf_counter() - start, 1),
    }


def torch_nll(model_dir: Path) -> NllFn:
    """transformers Qwen3MoeForCausalLM, bf16 weights upcast to fp32."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def nll(w: np.ndarray) -> float:
        x = torch.from_numpy(w)
        with torch.no_grad():
            logits = model(input_ids=x[:, :-1]).logits.float()  # (b, ctx, V)
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum"
            )
        return float(loss)

    return nll


def mlx_nll(model: nn.Module) -> NllFn:
    """An mlx-lm model (fp32 activations)."""

    def nll(w: np.ndarray) -> float:
        x = mx.array(w)
        logits = model(x[:, :-1]).astype(mx.float32)  # (b, ctx, V)
        loss = nn.losses.cross_entropy(logits, x[:, 1:], reduction="sum")
        return float(np.asarray(loss))

    return nll


def quantize_int4(model: nn.Module, group_size: int, bits: int, experts_only: bool) -> None:
    """Quantize in place; the router gates (`mlp.gate`) always stay fp32."""

    def should_quantize(path: str, module: nn.Module) -> bool:
        if not hasattr(module, "to_quantized") or path.endswith("mlp.gate"):
            return False
        return "switch_mlp" in path if experts_only else True

    nn.quantize(model, group_size=group_size, bits=bits, class_predicate=should_quantize)


def greedy_texts(model_dir: Path, prompt: str, max_tokens: int) -> dict[str, str]:
    """Greedy continuations of `prompt` from transformers and from plain mlx-lm (fp32)."""
    import mlx_lm
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
    hf_text = str(tok.decode(out[0, ids.shape[1] :].tolist()))
    # mlx-lm's CPU gather_mm needs fp32: upcast the bf16 weights before generating.
    mlx_model, mlx_tok = mlx_lm.load(str(model_dir))[:2]
    mlx_model.set_dtype(mx.float32)
    mlx_text = mlx_lm.generate(mlx_model, mlx_tok, prompt, max_tokens=max_tokens)
    return {"transformers": hf_text, "mlx_lm": mlx_text}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    p.add_argument("--heldout", type=Path, help="heldout.txt from build_corpus (for perplexity)")
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--windows", type=int, default=None, help="evaluate only the first N windows")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument(
        "--only",
        default="torch_fp32,mlx_fp32,mlx_int4_experts,mlx_int4_all",
        help="comma-separated subset of the four evaluations",
    )
    p.add_argument("--generate", default=None, help="only print greedy continuations of this")
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args()

    if args.generate is not None:
        for name, text in greedy_texts(args.model, args.generate, args.max_tokens).items():
            print(f"--- {name}:\n{args.generate}{text}")
        return
    if args.heldout is None:
        p.error("--heldout is needed to compute perplexity")
    from edge0.model.loader import load

    windows = heldout_windows(args.model, args.heldout, args.ctx, args.windows)
    report: dict[str, object] = {"windows": len(windows), "tokens": int(windows[:, 1:].size)}
    only = set(args.only.split(","))
    if "torch_fp32" in only:
        report["torch_fp32"] = perplexity(torch_nll(args.model), windows, args.batch, "torch")
    if "mlx_fp32" in only:
        model = load(args.model).model
        report["mlx_fp32"] = perplexity(mlx_nll(model), windows, args.batch, "mlx fp32")
    for name, experts_only in (("mlx_int4_experts", True), ("mlx_int4_all", False)):
        if name not in only:
            continue
        model = load(args.model).model
        quantize_int4(model, 64, 4, experts_only)
        report[name] = perplexity(mlx_nll(model), windows, args.batch, name)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
