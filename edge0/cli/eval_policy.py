"""`edge0 eval quality --route-policy`: route policies against the teacher, via the runtime."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click


def policy_quality(
    model: str,
    corpus: str,
    teacher: str,
    policies: tuple[str, ...],
    k: int | None,
    deadline_ms: float | None,
    tiers: str,
    tokens: int,
    seq_len: int,
    prompt_len: int,
    split: str,
    json_out: str | None,
    md_out: str | None,
) -> None:
    """One row per (K, policy) and the exact resident reference (edge0.eval.policy)."""
    from edge0.cli.fp32 import blas_hint
    from edge0.cli.stream import is_layout
    from edge0.errors import ConfigError
    from edge0.eval.policy import evaluate_policy, markdown, teacher_logits, variants_for
    from edge0.layout.manifest import Manifest
    from edge0.loop import run
    from edge0.train.fp32 import load_fp32
    from edge0.train.traces import corpus_text, sample_windows, text_encoder

    if not is_layout(Path(model)):
        raise ConfigError(
            f"{model}: --route-policy runs the streaming engine; MODEL must be an "
            f"edge0-layout directory (`edge0 convert {model} OUT`)"
        )
    if prompt_len + 2 > seq_len:
        raise ConfigError(f"--prompt-len {prompt_len} leaves no decode step in --seq-len {seq_len}")
    blas_hint()
    t = load_fp32(teacher)
    windows = sample_windows(
        corpus_text(corpus, split), text_encoder(t.tokenizer), max(1, tokens // seq_len), seq_len
    )
    logits = teacher_logits(t.model, windows)
    text = Manifest.load(Path(model)).config
    top_k = int((text.get("text_config") or text)["num_experts_per_tok"])
    ks = [k] if k is not None else sorted({top_k, max(1, top_k // 2)}, reverse=True)
    rows: list[dict[str, Any]] = []
    for v in variants_for(list(policies), ks, deadline_ms):
        row = run(evaluate_policy(Path(model), v, logits, windows, prompt_len, tiers))
        click.echo(
            f"{row['variant']} K={row['k']}: KL {row['kl_mean']:.4f}, ppl ratio "
            f"{row['ppl_ratio']:.4f}, {row['decode_tps']:.1f} tok/s",
            err=True,
        )
        rows.append(row)
    body = markdown(rows, tiers)
    click.echo(body)
    result = {
        "model": model,
        "teacher": teacher,
        "tiers": tiers,
        "windows": len(windows),
        "seq_len": seq_len,
        "prompt_len": prompt_len,
        "rows": rows,
    }
    if json_out:
        Path(json_out).write_text(json.dumps(result, indent=2) + "\n")
    if md_out:
        Path(md_out).write_text(body)
