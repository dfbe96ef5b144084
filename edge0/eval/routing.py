"""Routing-prediction quality on held-out text: recall@K, exact set, F1, mass, per head and mean,
for both horizons (docs/prerouter.md, "3. Evaluation" and "Second horizon").
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from tqdm import tqdm

from edge0.routing.prerouter import PrerouterSet
from edge0.train.capture import run_and_record
from edge0.train.traces import NO_EXPERT

METRICS = ("recall", "exact", "f1", "mass")


def _hot(scores: mx.array, k: int) -> mx.array:
    inds = mx.argpartition(-scores, kth=k - 1, axis=-1)[..., :k]
    onehots = inds[..., None] == mx.arange(scores.shape[-1])
    return mx.any(onehots, axis=-2).astype(mx.float32)


def _row_metrics(pred: mx.array, truth: mx.array, k_model: int, k: int) -> dict[str, mx.array]:
    """Sums over rows of each metric; pred/truth (..., E) scores (truth = router logits)."""
    p, t_k, t_exec = _hot(pred, k), _hot(truth, k), _hot(truth, k_model)
    hit = mx.sum(p * t_k, axis=-1)
    probs = mx.softmax(truth, axis=-1)
    return {
        "recall": mx.sum(hit / k),
        "exact": mx.sum(hit == k),
        "f1": mx.sum(2 * mx.sum(p * t_exec, axis=-1) / (k + k_model)),
        "mass": mx.sum(mx.sum(p * probs, axis=-1)),
    }


def evaluate_routing(
    model: nn.Module,
    windows: np.ndarray,
    ks: list[int],
    trained: PrerouterSet | None = None,
    batch: int = 4,
    layer_trained: PrerouterSet | None = None,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Run `model` over (n, S) token windows and score every predictor at each K."""
    init = PrerouterSet.from_model(model, wrap=True)
    for heads, horizon in ((trained, "token"), (layer_trained, "layer")):
        if heads is not None:
            heads.check_model(model)
            if heads.config.horizon != horizon:
                raise ValueError(f"expected {horizon}-horizon heads, got {heads.config.horizon}")
    cfg = init.config
    preds = ["shuffle", "temporal", "init"] + (["trained"] if trained is not None else [])
    layer_preds = ["layer-init"] + (["layer-trained"] if layer_trained is not None else [])
    pairs = list(enumerate(cfg.heads()))  # (pair index, (owner layer, target layer))
    pos = {layer: i for i, layer in enumerate(cfg.moe_layers)}

    def scored(owner: int, target: int) -> list[str]:  # layer horizon: forward heads only
        return preds + (layer_preds if target > owner else [])

    sums = {
        (p, k, j, m): 0.0 for j, (o, t) in pairs for p in scored(o, t) for k in ks for m in METRICS
    }
    rows = 0
    rng = np.random.default_rng(seed)
    on_tty = None if progress else True  # tqdm's None: only on a terminal
    bar = tqdm(total=windows.size, unit="tok", desc="eval routing", disable=on_tty)
    for lo in range(0, len(windows), batch):
        toks = windows[lo : lo + batch]
        r = run_and_record(model, mx.array(toks), np.dtype(np.float32))
        rows += toks.shape[0] * (toks.shape[1] - 1)
        for j, (owner, target) in pairs:
            a, b = pos[owner], pos[target]
            hidden = mx.array(r.hidden[:, a, :-1])  # (B, S-1, d) at token t
            topk_t = mx.array(r.topk[:, a, :-1].astype(np.int32))
            prev = np.full_like(r.topk[:, a, :-1], NO_EXPERT, dtype=np.int32)
            prev[:, 1:] = r.topk[:, a, :-2]
            truth = mx.array(r.logits[:, b, 1:])  # (B, S-1, E) target layer at t+1
            scores = {
                "shuffle": mx.array(rng.random(truth.shape, dtype=np.float32)),
                "temporal": mx.array(r.logits[:, b, :-1]),
                "init": init.predict(owner, hidden, topk_t, mx.array(prev)),
            }
            if trained is not None:
                scores["trained"] = trained.predict(owner, hidden, topk_t, mx.array(prev))
            truths = dict.fromkeys(preds, truth)
            if target > owner:
                same = mx.array(r.logits[:, b, :-1])  # target layer at the same token t
                scores["layer-init"] = scores["init"]  # the same next router, other target
                truths["layer-init"] = same
                if layer_trained is not None:
                    scores["layer-trained"] = layer_trained.predict(
                        owner, hidden, topk_t, mx.array(prev)
                    )
                    truths["layer-trained"] = same
            for p in scored(owner, target):
                for k in ks:
                    got = _row_metrics(scores[p], truths[p], cfg.top_k, k)
                    mx.eval(got)
                    for m, v in got.items():
                        sums[(p, k, j, m)] += float(v)
        bar.update(toks.size)
    bar.close()
    per_head = {
        f"{owner}->{target}": {
            p: {str(k): {m: sums[(p, k, j, m)] / rows for m in METRICS} for k in ks}
            for p in scored(owner, target)
        }
        for j, (owner, target) in pairs
    }
    forward = [f"{o}->{t}" for _, (o, t) in pairs if t > o]  # mean leaves out the wrap head
    mean = {
        p: {
            str(k): {
                m: float(np.mean([per_head[h][p][str(k)][m] for h in forward])) for m in METRICS
            }
            for k in ks
        }
        for p in preds + layer_preds
    }
    return {
        "top_k": cfg.top_k,
        "num_experts": cfg.num_experts,
        "ks": ks,
        "rows_per_head": rows,
        "predictors": preds + layer_preds,
        "mean": mean,
        "per_head": per_head,
    }


def markdown(result: dict[str, Any]) -> str:
    """The mean table (predictor x K x metric), then recall@K per head."""
    ks = [str(k) for k in result["ks"]]
    head = "| predictor | " + " | ".join(f"{m}@{k}" for k in ks for m in METRICS) + " |"
    lines = [head, "|" + "---|" * (1 + len(ks) * len(METRICS))]
    for p in result["predictors"]:
        cells = [f"{result['mean'][p][k][m]:.3f}" for k in ks for m in METRICS]
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    heads = list(result["per_head"])
    lines += [
        "",
        "| recall@K per head | " + " | ".join(heads) + " |",
        "|" + "---|" * (1 + len(heads)),
    ]
    for k in ks:
        for p in result["predictors"]:
            cells = [
                f"{result['per_head'][h][p][k]['recall']:.3f}"
                if p in result["per_head"][h]
                else "-"
                for h in heads
            ]
            lines.append(f"| {p} @{k} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
