"""Student vs teacher on held-out text: perplexity ratio, KL, top-1 agreement, greedy divergence."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_unflatten
from tqdm import tqdm

from edge0.log import get_logger
from edge0.model import lora
from edge0.model.merge import merge_lora
from edge0.routing.prerouter import PrerouterSet
from edge0.train import routed

log = get_logger(__name__)


@attrs.frozen
class Variant:
    """One row of the table: routing (resident or route with some heads) and an adapter."""

    name: str
    heads: str  # "resident" (true routing at the model's top-k) | "init" | "trained"
    adapter: Path | None = None
    merged: bool = False  # merge the adapter into the int4 weights and requantize


def token_stats(
    teacher_logits: mx.array, student_logits: mx.array, targets: mx.array
) -> dict[str, np.ndarray]:
    """Per-token nll_teacher, nll_student, KL(teacher || student), top-1 agreement (flattened)."""
    lt = nn.log_softmax(teacher_logits.astype(mx.float32), axis=-1)  # (B, S, V)
    ls = nn.log_softmax(student_logits.astype(mx.float32), axis=-1)
    tgt = targets[..., None]
    stats = {
        "nll_teacher": -mx.take_along_axis(lt, tgt, axis=-1)[..., 0],
        "nll_student": -mx.take_along_axis(ls, tgt, axis=-1)[..., 0],
        "kl": (mx.exp(lt) * (lt - ls)).sum(axis=-1),
        "agree": (mx.argmax(lt, axis=-1) == mx.argmax(ls, axis=-1)).astype(mx.float32),
    }
    return {k: np.array(v).reshape(-1) for k, v in stats.items()}


def first_divergence(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(N, G) greedy continuations -> (N,) index of the first differing token (G if none)."""
    differ = a != b
    return np.where(differ.any(axis=1), differ.argmax(axis=1), a.shape[1])


def summarize(stats: dict[str, np.ndarray], divergence: np.ndarray) -> dict[str, float]:
    kl = stats["kl"]
    return {
        "ppl_ratio": float(np.exp(stats["nll_student"].mean() - stats["nll_teacher"].mean())),
        "kl_mean": float(kl.mean()),
        "kl_p99": float(np.percentile(kl, 99)),
        "top1_agree": float(stats["agree"].mean()),
        "first_divergence_mean": float(divergence.mean()) if divergence.size else float("nan"),
        "first_divergence_median": float(np.median(divergence))
        if divergence.size
        else float("nan"),
        "tokens": int(kl.size),
    }


@contextmanager
def _adapter(model: nn.Module, variant: Variant) -> Iterator[dict[str, Any]]:
    """Apply the variant's adapter (merged if asked) for the duration, then restore the model."""
    info: dict[str, Any] = {}
    if variant.adapter is None:
        yield info
        return
    lora.load_adapters(model, variant.adapter)
    bases = [(p, m.linear) for p, m in lora.lora_modules(model)]
    try:
        if variant.merged:
            info["merge_weights"] = attrs.asdict(merge_lora(model, requantize=True))
        yield info
    finally:
        model.update_modules(tree_unflatten(bases))


def _greedy(
    model: nn.Module, state: routed.RouteState | None, prompts: np.ndarray, n: int
) -> np.ndarray:
    p = mx.array(prompts)
    seq, _ = routed.generate(model, state, p, n, temperature=0.0)
    return np.array(seq[:, prompts.shape[1] :])


def evaluate_variant(
    teacher: nn.Module,
    student: nn.Module,
    variant: Variant,
    heads: PrerouterSet | None,
    k: int,
    windows: np.ndarray,
    prompts: np.ndarray,
    gen_len: int,
    teacher_greedy: np.ndarray,
    batch: int = 4,
    wrap: bool | None = None,
) -> dict[str, Any]:
    """Figures of one variant over (N, S) held-out windows and (M, P) greedy prompts."""
    parts: dict[str, list[np.ndarray]] = {}
    with _adapter(student, variant) as info:
        if variant.heads == "resident":
            routing: Any = _nothing()
        else:
            routing = routed.routed(student, heads, k, wrap=wrap)
        with routing as state:
            for i in range(0, len(windows), batch):
                w = mx.array(windows[i : i + batch])
                x, y = w[:, :-1], w[:, 1:]
                if state is None:
                    s_logits = student(x)
                else:
                    s_logits, _ = routed.plan_logits(student, state, x)
                for key, v in token_stats(teacher(x), s_logits, y).items():
                    parts.setdefault(key, []).append(v)
            greedy = [
                _greedy(student, state, prompts[i : i + batch], gen_len)
                for i in range(0, len(prompts), batch)
            ]
    stats = {key: np.concatenate(v) for key, v in parts.items()}
    div = first_divergence(teacher_greedy, np.concatenate(greedy)) if greedy else np.array([])
    row: dict[str, Any] = {"variant": variant.name, "heads": variant.heads, "k": k}
    row["adapter"] = str(variant.adapter) if variant.adapter else None
    row.update(summarize(stats, div))
    row.update(info)
    log.info("quality.variant", **{k_: v for k_, v in row.items() if k_ != "merge_weights"})
    return row


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


def evaluate_quality(
    teacher: nn.Module,
    student: nn.Module,
    variants: list[Variant],
    heads: dict[str, PrerouterSet],
    k: int,
    windows: np.ndarray,
    prompts: np.ndarray,
    gen_len: int,
    batch: int = 4,
    wrap: bool | None = None,
) -> dict[str, Any]:
    """Every variant's row plus the derived figures (gap closed by stage 3, merge retention)."""
    teacher_greedy = (
        np.concatenate(
            [
                _greedy(teacher, None, prompts[i : i + batch], gen_len)
                for i in range(0, len(prompts), batch)
            ]
        )
        if len(prompts)
        else np.zeros((0, gen_len), np.int64)
    )
    rows = []
    for v in tqdm(variants, desc="quality", unit="variant"):
        top_k = k if v.heads != "resident" else _model_top_k(student)
        rows.append(
            evaluate_variant(
                teacher,
                student,
                v,
                heads.get(v.heads),
                top_k,
                windows,
                prompts,
                gen_len,
                teacher_greedy,
                batch,
                wrap,
            )
        )
    return {"k": k, "wrap": wrap, "rows": rows, "derived": derived(rows)}


def _model_top_k(model: nn.Module) -> int:
    from edge0.routing.prerouter import block_top_k, moe_blocks

    return block_top_k(moe_blocks(model)[0][1])


def derived(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """KL-gap closed by the last unmerged adapter, and how much of that gain survives merging."""
    by = {r["variant"]: r for r in rows}
    base = by.get("route-trained") or by.get("route-init")
    stage3 = by.get("lora-distill") or by.get("lora-final") or by.get("lora-sft")
    merged = by.get("lora-merged")
    out: dict[str, float | None] = {"kl_gap_closed": None, "merge_retention": None}
    if base and stage3 and base["kl_mean"] > 0:
        gain = base["kl_mean"] - stage3["kl_mean"]
        out["kl_gap_closed"] = gain / base["kl_mean"]
        if merged and gain != 0:
            out["merge_retention"] = (base["kl_mean"] - merged["kl_mean"]) / gain
    return out


def markdown(result: dict[str, Any]) -> str:
    """The table for docs/: one row per variant, then the derived figures."""
    lines = [
        f"Route capacity K = {result['k']} (resident rows use the model's own top-k).",
        "",
        "| variant | heads | ppl ratio | KL mean | KL p99 | top-1 agree | first greedy div. |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['variant']} | {r['heads']} | {r['ppl_ratio']:.4f} | {r['kl_mean']:.4f} | "
            f"{r['kl_p99']:.4f} | {r['top1_agree']:.4f} | {r['first_divergence_mean']:.1f} |"
        )
    d = result["derived"]
    lines.append("")
    if d.get("kl_gap_closed") is not None:
        lines.append(
            f"KL gap to the teacher closed by the adapter: {100 * d['kl_gap_closed']:.1f}%"
        )
    if d.get("merge_retention") is not None:
        lines.append(
            "Logit-level (KL) gain surviving merge + requantization: "
            f"{100 * d['merge_retention']:.1f}%"
        )
    return "\n".join(lines) + "\n"
