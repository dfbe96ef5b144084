"""Stage 1: distil prerouter heads from routing traces in MLX (KL + top-K set BCE)."""

from __future__ import annotations

import time
from typing import Any

import attrs
import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from tqdm import tqdm

from edge0.errors import ConfigError
from edge0.log import get_logger
from edge0.routing.prerouter import PrerouterHead, PrerouterSet, multi_hot
from edge0.train.traces import TraceSet, head_rows, horizon_lead

log = get_logger(__name__)


@attrs.frozen
class HeadTrainConfig:
    k: int  # routing capacity the set term targets (teacher's top-K)
    hidden: int | None = None  # fc1 width; None = d_model // 4
    batch: int = 512
    lr: float = 2e-3
    weight_decay: float = 1e-4
    set_weight: float = 0.5  # weight of the top-K set BCE next to the KL
    max_steps: int = 4000
    eval_every: int = 100
    patience: int = 6  # evaluations without held-out improvement before stopping
    heldout_frac: float = 0.1
    heldout_rows: int = 4096
    max_minutes: float | None = None
    seed: int = 0


class _Heads(nn.Module):
    """The heads as one module so one optimizer updates them all."""

    def __init__(self, heads: list[PrerouterHead]) -> None:
        super().__init__()
        self.heads = heads


Batch = list[
    tuple[mx.array, mx.array, mx.array, mx.array]
]  # per head: hidden, hot_t, hot_prev, target


def make_batch(
    ts: TraceSet,
    seqs: np.ndarray,
    pos: np.ndarray,
    pairs: list[tuple[int, int]],
    lead: int = 1,
) -> Batch:
    e = ts.meta.num_experts
    out = []
    for a, b in pairs:
        h, t, p, y = head_rows(ts, seqs, pos, a, b, lead)
        rows = (len(seqs),)
        out.append(
            (
                mx.array(h),
                multi_hot(mx.array(t), e, rows),
                multi_hot(mx.array(p), e, rows),
                mx.array(y),
            )
        )
    return out


def topk_hot(logits: mx.array, k: int) -> mx.array:
    """(R, E) -> (R, E) float multi-hot of the k largest entries."""
    inds = mx.argpartition(-logits, kth=k - 1, axis=-1)[..., :k]
    return multi_hot(inds, logits.shape[-1], tuple(logits.shape[:-1]))


def head_loss(z: mx.array, target: mx.array, k: int, set_weight: float) -> mx.array:
    """KL(softmax(target) || softmax(z)) + set_weight * sum_e BCE(sigmoid(z_e), y_e) / k, row mean.

    y is the multi-hot of the teacher's top-k set. Softmax is shift-invariant, so the KL
    leaves the logit level free and the BCE uses it to put the top-k set above 0.
    """
    logp = target - mx.logsumexp(target, axis=-1, keepdims=True)
    logq = z - mx.logsumexp(z, axis=-1, keepdims=True)
    kl = mx.sum(mx.exp(logp) * (logp - logq), axis=-1)
    y = topk_hot(target, k)
    bce = mx.sum(nn.softplus(z) - y * z, axis=-1) / k
    return mx.mean(kl + set_weight * bce)


def recall_at(z: mx.array, target: mx.array, k: int) -> mx.array:
    """Mean |top-k(z) ∩ top-k(target)| / k over rows."""
    return mx.mean(mx.sum(topk_hot(z, k) * topk_hot(target, k), axis=-1) / k)


def _split(ts: TraceSet, frac: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    n = ts.hidden.shape[0]
    if n < 2:
        raise ConfigError("traces hold fewer than 2 windows; collect more with --tokens")
    order = np.random.default_rng(seed).permutation(n)
    n_held = max(1, int(round(n * frac)))
    return np.sort(order[n_held:]), np.sort(order[:n_held])


def train_heads(
    ts: TraceSet, init: PrerouterSet, cfg: HeadTrainConfig, progress: bool = True
) -> tuple[PrerouterSet, dict[str, Any]]:
    """Train `init`'s heads (in place) on `ts`; returns the best-on-held-out set and a summary.

    The heads' horizon (init.config.horizon) picks the targets: the next MoE layer at t+1
    ("token") or at t ("layer", no wrap-around head).
    """
    if tuple(init.config.moe_layers) != ts.meta.moe_layers:
        raise ConfigError(
            f"traces are for MoE layers {list(ts.meta.moe_layers)}, the model has "
            f"{list(init.config.moe_layers)}; collect traces from this model"
        )
    pairs = ts.pairs(wrap=init.config.wrap)
    lead = horizon_lead(init.config.horizon)
    owners = [init.config.moe_layers[a] for a, _ in pairs]
    module = _Heads([init.heads[o] for o in owners])
    rng = np.random.default_rng(cfg.seed)
    train_seqs, held_seqs = _split(ts, cfg.heldout_frac, cfg.seed)
    s = ts.meta.seq_len
    span = s - lead  # token positions with a target inside the window
    n_held = min(cfg.heldout_rows, len(held_seqs) * span)
    held = make_batch(ts, rng.choice(held_seqs, n_held), rng.integers(0, span, n_held), pairs, lead)

    def loss_fn(mod: _Heads, batch: Batch) -> mx.array:
        losses = [
            head_loss(h(x, ht, hp), y, cfg.k, cfg.set_weight)
            for h, (x, ht, hp, y) in zip(mod.heads, batch, strict=True)
        ]
        return mx.sum(mx.stack(losses))

    def evaluate() -> tuple[float, float, list[float]]:
        loss = loss_fn(module, held)
        recalls = [
            recall_at(h(x, ht, hp), y, cfg.k)
            for h, (x, ht, hp, y) in zip(module.heads, held, strict=True)
        ]
        mx.eval(loss, recalls)
        per = [float(r) for r in recalls]
        return float(loss), float(np.mean(per)), per

    opt = optim.AdamW(learning_rate=cfg.lr, weight_decay=cfg.weight_decay)
    step_fn = nn.value_and_grad(module, loss_fn)
    loss0, rec0, per0 = evaluate()
    best = (-loss0, rec0, 0, module.parameters(), per0)  # ranked by held-out loss
    log.info("heads.init", heldout_loss=loss0, heldout_recall=rec0)
    stale, started, step = 0, time.monotonic(), 0
    on_tty = None if progress else True  # tqdm's None: only on a terminal
    bar = tqdm(total=cfg.max_steps, desc="heads", unit="step", disable=on_tty)
    bar.set_postfix(held_loss=f"{loss0:.3f}", recall=f"{rec0:.3f}")
    for step in range(1, cfg.max_steps + 1):
        seqs = rng.choice(train_seqs, cfg.batch)
        batch = make_batch(ts, seqs, rng.integers(0, span, cfg.batch), pairs, lead)
        loss, grads = step_fn(module, batch)
        opt.update(module, grads)
        mx.eval(module.parameters(), opt.state, loss)
        bar.update(1)
        if step % cfg.eval_every and step != cfg.max_steps:
            continue
        hl, rec, per = evaluate()
        bar.set_postfix(loss=f"{float(loss):.3f}", held_loss=f"{hl:.3f}", recall=f"{rec:.3f}")
        log.info(
            "heads.eval", step=step, train_loss=float(loss), heldout_loss=hl, heldout_recall=rec
        )
        if -hl > best[0]:
            best, stale = (-hl, rec, step, module.parameters(), per), 0
        else:
            stale += 1
        over_time = (
            cfg.max_minutes is not None and time.monotonic() - started > cfg.max_minutes * 60
        )
        if stale >= cfg.patience or over_time:
            break
    bar.close()
    module.update(best[3])
    mx.eval(module.parameters())
    summary = {
        "k": cfg.k,
        "horizon": init.config.horizon,
        "loss": f"KL(teacher||head) + {cfg.set_weight} * "
        f"sum_e BCE(sigmoid(z_e), top{cfg.k}_e) / {cfg.k}",
        "steps_run": step,
        "best_step": best[2],
        "seconds": round(time.monotonic() - started, 1),
        "heldout_loss_init": round(loss0, 4),
        "heldout_loss": round(-best[0], 4),
        "heldout_recall_init": round(rec0, 4),
        "heldout_recall": round(best[1], 4),
        "heldout_recall_per_head": {
            str(o): round(r, 4) for o, r in zip(owners, best[4], strict=True)
        },
        "traces": {"source": ts.meta.source, "windows": ts.meta.windows, "seq_len": s},
        "hparams": attrs.asdict(cfg),
    }
    trained = PrerouterSet(attrs.evolve(init.config, trained=True, info=summary), init.heads)
    return trained, summary
