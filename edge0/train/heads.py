"""Stage 1: distil prerouter heads from routing traces (KL + top-K set BCE), early stopping."""

from __future__ import annotations

import os
import time
from typing import Any

import attrs
import mlx.core as mx
import numpy as np
from threadpoolctl import threadpool_limits
from tqdm import tqdm

from edge0.errors import ConfigError
from edge0.log import get_logger
from edge0.routing.prerouter import PrerouterSet
from edge0.train.head_fit import (
    HeadParams,
    Rows,
    adamw,
    forward,
    loss_and_grad,
    multi_hot,
    objective,
    recall,
)
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


def blas_threads() -> int:
    """Threads for numpy's BLAS: the cores that the last minute's load leaves free, at least
    one. OpenBLAS's threads spin while they wait; on a busy 2-core machine two of them ran a
    step 28x slower than one (measured: docs/prerouter.md)."""
    cores = os.cpu_count() or 1
    return max(1, min(cores, cores - round(os.getloadavg()[0])))


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
    ("token") or at t ("layer", no wrap-around head). Each step trains every head on the
    same sampled rows (edge0.train.head_fit); the traces may be memory maps, of which a
    step reads only its rows, and held-out rows are read again at each evaluation.
    """
    if tuple(init.config.moe_layers) != ts.meta.moe_layers:
        raise ConfigError(
            f"traces are for MoE layers {list(ts.meta.moe_layers)}, the model has "
            f"{list(init.config.moe_layers)}; collect traces from this model"
        )
    pairs = ts.pairs(wrap=init.config.wrap)
    lead = horizon_lead(init.config.horizon)
    owners = [init.config.moe_layers[a] for a, _ in pairs]
    params = [HeadParams.of(init.heads[o]) for o in owners]
    e = ts.meta.num_experts
    rng = np.random.default_rng(cfg.seed)
    train_seqs, held_seqs = _split(ts, cfg.heldout_frac, cfg.seed)
    s = ts.meta.seq_len
    span = s - lead  # token positions with a target inside the window
    n_held = min(cfg.heldout_rows, len(held_seqs) * span)
    held = (rng.choice(held_seqs, n_held), rng.integers(0, span, n_held))

    def rows(pair: tuple[int, int], seqs: np.ndarray, pos: np.ndarray) -> Rows:
        h, t, p, y = head_rows(ts, seqs, pos, *pair, lead)
        return Rows(h, np.concatenate([multi_hot(t, e), multi_hot(p, e)], axis=1), y)

    def evaluate() -> tuple[float, float, list[float]]:
        loss, per = 0.0, []
        for pair, hp in zip(pairs, params, strict=True):
            r = rows(pair, *held)
            z, _ = forward(hp.w, r)
            loss += objective(z, r.target, cfg.k, cfg.set_weight)[0]
            per.append(recall(z, r.target, cfg.k))
        return loss, float(np.mean(per)), per

    threads = blas_threads()  # numpy's BLAS runs the steps; see blas_threads
    log.info("heads.blas", threads=threads)
    with threadpool_limits(threads, user_api="blas"):
        loss0, rec0, per0 = evaluate()
        best = (-loss0, rec0, 0, [hp.copy() for hp in params], per0)  # ranked by held-out loss
        log.info("heads.init", heldout_loss=loss0, heldout_recall=rec0)
        stale, started, step = 0, time.monotonic(), 0
        on_tty = None if progress else True  # tqdm's None: only on a terminal
        bar = tqdm(total=cfg.max_steps, desc="heads", unit="step", disable=on_tty)
        bar.set_postfix(held_loss=f"{loss0:.3f}", recall=f"{rec0:.3f}")
        for step in range(1, cfg.max_steps + 1):
            seqs, pos = rng.choice(train_seqs, cfg.batch), rng.integers(0, span, cfg.batch)
            loss = 0.0
            for pair, hp in zip(pairs, params, strict=True):
                value, grads = loss_and_grad(hp.w, rows(pair, seqs, pos), cfg.k, cfg.set_weight)
                adamw(hp, grads, cfg.lr, cfg.weight_decay)
                loss += value
            bar.update(1)
            if step % cfg.eval_every and step != cfg.max_steps:
                continue
            hl, rec, per = evaluate()
            bar.set_postfix(loss=f"{loss:.3f}", held_loss=f"{hl:.3f}", recall=f"{rec:.3f}")
            log.info("heads.eval", step=step, train_loss=loss, heldout_loss=hl, heldout_recall=rec)
            if -hl > best[0]:
                best, stale = (-hl, rec, step, [hp.copy() for hp in params], per), 0
            else:
                stale += 1
            over_time = (
                cfg.max_minutes is not None and time.monotonic() - started > cfg.max_minutes * 60
            )
            if stale >= cfg.patience or over_time:
                break
        bar.close()
    for owner, hp, weights in zip(owners, params, best[3], strict=True):
        hp.load_into(init.heads[owner], weights)
    mx.eval([init.heads[o].parameters() for o in owners])
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
