"""Train the demo teacher: a small qwen3_moe language model on the stdlib corpus, torch on CPU."""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer
from tqdm import tqdm
from transformers import GenerationConfig, Qwen3MoeConfig, Qwen3MoeForCausalLM

EOT = "<|endoftext|>"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def model_config(vocab_size: int, eot_id: int, pad_id: int, ctx: int) -> Qwen3MoeConfig:
    """The teacher's shape: ~29M parameters, 8 MoE layers of 32 experts, top-4."""
    shape: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=512,  # unused: every layer is sparse
        moe_intermediate_size=128,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        num_experts=32,
        num_experts_per_tok=4,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_position_embeddings=ctx,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        router_aux_loss_coef=0.01,
        output_router_logits=False,
        bos_token_id=None,
        eos_token_id=eot_id,
        pad_token_id=pad_id,
    )
    return Qwen3MoeConfig(**shape)


def load_tokens(tok: Tokenizer, path: Path) -> np.ndarray:
    """Encode one split to a flat int32 token stream, cached next to the text."""
    cache = path.with_suffix(".ids.npy")
    if cache.exists() and cache.stat().st_mtime >= path.stat().st_mtime:
        return np.load(cache)
    ids = np.asarray(tok.encode(path.read_text(encoding="utf-8")).ids, dtype=np.int32)
    np.save(cache, ids)
    return ids


def heldout_windows(ids: np.ndarray, ctx: int, limit: int | None) -> torch.Tensor:
    """Non-overlapping (n, ctx + 1) windows over the held-out stream (first `limit` of them)."""
    n = (len(ids) - 1) // ctx
    if limit is not None:
        n = min(n, limit)
    rows = [ids[i * ctx : i * ctx + ctx + 1] for i in range(n)]
    return torch.from_numpy(np.stack(rows).astype(np.int64))  # (n, ctx + 1)


@torch.no_grad()
def evaluate(model: Qwen3MoeForCausalLM, windows: torch.Tensor, batch: int) -> float:
    """Mean next-token cross-entropy (nats) over the windows, fp32, no aux loss."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch):
        w = windows[i : i + batch]
        logits = model(input_ids=w[:, :-1]).logits.float()  # (b, ctx, vocab)
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1), reduction="sum"
        )
        total += loss.item()
        count += w[:, 1:].numel()
    model.train()
    return total / count


def lr_at(step: int, progress: float, peak: float, warmup: int, floor: float) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to floor * peak as progress -> 1."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, max(0.0, progress))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


def save_hf(model: Qwen3MoeForCausalLM, corpus: Path, out: Path, eot_id: int) -> None:
    """Write the bf16 HF checkpoint plus tokenizer and generation config."""
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)  # type: ignore[arg-type]
    model.to(torch.float32)  # type: ignore[arg-type]
    for name in TOKENIZER_FILES:
        shutil.copy(corpus / name, out / name)
    cfg = json.loads((out / "config.json").read_text())
    cfg.setdefault("rope_theta", cfg.get("rope_parameters", {}).get("rope_theta", 10000.0))
    cfg["num_experts"] = model.config.num_experts
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    gen = GenerationConfig(eos_token_id=eot_id, pad_token_id=eot_id, do_sample=False)
    gen.save_pretrained(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--corpus", type=Path, required=True, help="dir from tools/build_corpus.py")
    p.add_argument("--work", type=Path, required=True, help="dir for checkpoints, CSV, final model")
    p.add_argument("--steps", type=int, default=2000, help="schedule length (deterministic)")
    p.add_argument(
        "--minutes",
        type=float,
        default=0.0,
        help="if > 0: schedule by wall-clock instead, stopping after this many minutes",
    )
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-windows", type=int, default=32)
    p.add_argument("--ckpt-every", type=int, default=100)
    p.add_argument("--threads", type=int, default=1, help="1 is fastest on a busy machine")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--experts-impl", default="grouped_mm", choices=["grouped_mm", "eager"])
    p.add_argument("--bench", type=int, default=0, help="only time this many steps and exit")
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tok = Tokenizer.from_file(str(args.corpus / "tokenizer.json"))
    eot_id, pad_id = tok.token_to_id(EOT), tok.token_to_id("<|pad|>")
    assert eot_id is not None and pad_id is not None, "corpus tokenizer lacks special tokens"
    train_ids = load_tokens(tok, args.corpus / "train.txt")
    held_ids = load_tokens(tok, args.corpus / "heldout.txt")
    config = model_config(tok.get_vocab_size(), eot_id, pad_id, args.ctx)
    # grouped_mm is ~1.6x faster than the per-expert loop on CPU (same losses); not saved.
    config._experts_implementation = args.experts_impl
    model = Qwen3MoeForCausalLM(config).float()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params {n_params / 1e6:.2f}M, train tokens {len(train_ids):,}, held {len(held_ids):,}")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    rng = np.random.default_rng(args.seed)
    start_step, tokens_seen, elapsed = 0, 0, 0.0
    args.work.mkdir(parents=True, exist_ok=True)
    ckpt_path = args.work / "ckpt.pt"
    if ckpt_path.exists() and not args.bench:
        state = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        rng.bit_generator.state = state["rng"]
        start_step, tokens_seen, elapsed = state["step"], state["tokens"], state["elapsed"]
        print(f"resumed at step {start_step}")
    held_small = heldout_windows(held_ids, args.ctx, args.eval_windows)
    csv_path = args.work / "loss.csv"
    if start_step == 0 and not args.bench:
        with open(csv_path, "w", newline="") as f:
            csv.writer(f).writerow(
                ["step", "tokens", "elapsed_s", "lr", "train_loss", "heldout_loss", "aux_loss"]
            )
    steps = args.bench or args.steps
    budget_s = args.minutes * 60.0
    if budget_s > 0 and not args.bench:
        steps = 10**9  # the clock ends the run

    def progress(step: int) -> float:
        if budget_s > 0:
            return (time.perf_counter() - t0) / budget_s
        return (step - args.warmup) / max(1, steps - args.warmup)

    model.train()
    run_loss, run_aux, run_n = 0.0, 0.0, 0
    t0 = time.perf_counter() - elapsed
    done = start_step
    step_iter = itertools.count(start_step) if budget_s > 0 else range(start_step, steps)
    bar = tqdm(step_iter, initial=start_step, total=None if budget_s > 0 else steps)
    for step in bar:
        if progress(step) >= 1.0 and budget_s > 0:
            break
        starts = rng.integers(0, len(train_ids) - args.ctx - 1, size=args.batch)
        batch = np.stack([train_ids[s : s + args.ctx + 1] for s in starts]).astype(np.int64)
        x = torch.from_numpy(batch)  # (batch, ctx + 1)
        lr = lr_at(step, progress(step), args.lr, args.warmup, 0.1)
        for group in opt.param_groups:
            group["lr"] = lr
        out = model(input_ids=x[:, :-1], output_router_logits=True)
        logits = out.logits  # (batch, ctx, vocab)
        lm_loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)
        )
        (lm_loss + config.router_aux_loss_coef * out.aux_loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        aux = out.aux_loss.item()
        run_loss += lm_loss.item()
        run_aux += aux
        run_n += 1
        tokens_seen += x[:, :-1].numel()
        elapsed = time.perf_counter() - t0
        bar.set_postfix(loss=f"{run_loss / run_n:.3f}", tok_s=f"{tokens_seen / elapsed:.0f}")
        done = step + 1
        if args.bench:
            continue
        last = done == steps or (budget_s > 0 and progress(done) >= 1.0)
        if done % args.eval_every == 0 or last:
            held = evaluate(model, held_small, args.batch)
            with open(csv_path, "a", newline="") as f:
                csv.writer(f).writerow(
                    [
                        done,
                        tokens_seen,
                        f"{elapsed:.1f}",
                        f"{lr:.6g}",
                        f"{run_loss / run_n:.4f}",
                        f"{held:.4f}",
                        f"{run_aux / run_n:.4f}",
                    ]
                )
            tqdm.write(f"step {done} train {run_loss / run_n:.3f} heldout {held:.3f}")
            run_loss, run_aux, run_n = 0.0, 0.0, 0
        if done % args.ckpt_every == 0 or last:
            state = {
                "model": model.state_dict(),
                "opt": opt.state_dict(),
                "step": done,
                "rng": rng.bit_generator.state,
                "tokens": tokens_seen,
                "elapsed": elapsed,
            }
            torch.save(state, ckpt_path.with_suffix(".tmp"))
            ckpt_path.with_suffix(".tmp").replace(ckpt_path)
    bar.close()
    if args.bench:
        print(f"bench: {tokens_seen} tokens in {elapsed:.1f}s = {tokens_seen / elapsed:.0f} tok/s")
        return
    held_all = heldout_windows(held_ids, args.ctx, None)
    held_loss = evaluate(model, held_all, args.batch)
    summary = {
        "steps": done,
        "tokens_seen": tokens_seen,
        "train_seconds": round(elapsed, 1),
        "tok_per_s": round(tokens_seen / elapsed, 1),
        "params": n_params,
        "heldout_tokens": int(held_all[:, 1:].numel()),
        "heldout_loss_fp32": round(held_loss, 4),
        "heldout_ppl_fp32": round(math.exp(held_loss), 3),
    }
    print(json.dumps(summary, indent=2))
    save_hf(model, args.corpus, args.work / "hf", eot_id)
    (args.work / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
