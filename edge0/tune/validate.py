"""Validation of trained heads on held-out text: what `route` mode will cost in quality.

Two measurements. From held-out traces: each head's recall@K of the experts the next MoE
layer truly runs at the next token, beside the "same experts as the last token" rule.
From the engine itself: held-out windows decoded teacher-forced in `route` mode (the heads'
prediction is the routing) and in `hint` mode (exact); per position, whether the greedy
next token agrees, and the KL of route's distribution from the exact one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from numpy.lib.format import open_memmap

from edge0.routing.prerouter import PrerouterSet, multi_hot
from edge0.routing.validation import quietly
from edge0.train.rows import take
from edge0.train.traces import TraceSet, head_rows, horizon_lead

ROWS = 4096  # held-out rows per head for recall (all of them when fewer)


def head_recall(heads: PrerouterSet, ts: TraceSet, k: int, seed: int = 0) -> dict[str, Any]:
    """Recall@k per head over held-out traces, against the executed experts of the target
    layer at the next token (at this token for layer-horizon heads); `temporal` is the same
    figure for "the target's experts at the token before" (what a prefetcher without heads
    would guess)."""
    n, s = ts.hidden.shape[0], ts.meta.seq_len
    lead = horizon_lead(heads.config.horizon)
    rng = np.random.default_rng(seed)
    rows = min(ROWS, n * (s - 1))
    seqs, pos = rng.integers(0, n, rows), rng.integers(1 - lead, s - lead, rows)
    e = ts.meta.num_experts
    per: dict[str, float] = {}
    temporal: dict[str, float] = {}
    for (a, b), (owner, _) in zip(ts.pairs(heads.config.wrap), heads.config.heads(), strict=True):
        hidden, top_t, prev, _ = head_rows(ts, seqs, pos, a, b, lead=lead)
        z = heads.heads[owner](
            mx.array(hidden),
            multi_hot(mx.array(top_t), e, (rows,)),
            multi_hot(mx.array(prev), e, (rows,)),
        )
        guess = np.array(mx.argpartition(-z, kth=k - 1, axis=-1)[:, :k])
        truth = _truth(ts, seqs, b, pos + lead, k)
        per[str(owner)] = _overlap(guess, truth, k)
        temporal[str(owner)] = _overlap(_truth(ts, seqs, b, pos + lead - 1, k), truth, k)
    return {
        "recall": float(np.mean(list(per.values()))),
        "recall_per_layer": {o: round(r, 4) for o, r in per.items()},
        "temporal_recall": float(np.mean(list(temporal.values()))),
        "rows_per_layer": rows,
    }


def _truth(ts: TraceSet, seqs: np.ndarray, layer: int, pos: np.ndarray, k: int) -> np.ndarray:
    """The experts layer `layer` ran (at capacity k: the top k of its router's logits)."""
    if k == ts.meta.top_k:
        return np.asarray(take(ts.topk, seqs, layer, pos), dtype=np.int64)
    logits = take(ts.logits, seqs, layer, pos)
    return np.argpartition(-logits, k - 1, axis=-1)[:, :k]


def _overlap(guess: np.ndarray, truth: np.ndarray, k: int) -> float:
    hits = [len(set(g) & set(t)) for g, t in zip(guess.tolist(), truth.tolist(), strict=True)]
    return float(np.mean(hits)) / k


def agreement(exact: np.ndarray, route: np.ndarray, chunk: int = 16) -> dict[str, float]:
    """Greedy next-token agreement and KL(exact || route) over (T, V) logits rows, `chunk`
    rows at a time (the rows may be memory maps of files larger than the budget leaves)."""
    kl_rows, same_rows = [], []
    for i in range(0, len(exact), chunk):
        e = np.asarray(exact[i : i + chunk], dtype=np.float64)
        r = np.asarray(route[i : i + chunk], dtype=np.float64)
        lp = e - _logsumexp(e)
        lq = r - _logsumexp(r)
        kl_rows.append(np.sum(np.exp(lp) * (lp - lq), axis=-1))
        same_rows.append(np.argmax(e, axis=-1) == np.argmax(r, axis=-1))
    kl, same = np.concatenate(kl_rows), np.concatenate(same_rows)
    return {
        "agreement": float(np.mean(same)),
        "kl_mean": float(np.mean(kl)),
        "kl_p99": float(np.percentile(kl, 99)),
        "tokens": int(len(kl)),
    }


def _logsumexp(x: np.ndarray) -> np.ndarray:
    m = np.max(x, axis=-1, keepdims=True)
    out: np.ndarray = m + np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))
    return out


async def decode_logits(
    layout: Path,
    mode: str,
    windows: np.ndarray,
    prompt_len: int,
    engine: dict[str, Any],
    path: Path,
) -> np.ndarray:
    """The (T, V) logits of every held-out window decoded teacher-forced in `mode`, written
    row by row into `path` (.npy) and returned memory-mapped: the rows of a large vocabulary
    (248k x 4 bytes a token) would not fit beside the model in its budget."""
    from edge0.eval.policy import forced_decode
    from edge0.runtime.engine.api import Engine

    total = sum(len(w) - 1 - prompt_len for w in windows)
    out: list[np.memmap] = []
    done = [0]

    def sink(row: np.ndarray) -> None:
        if not out:
            out.append(open_memmap(path, mode="w+", dtype=np.float32, shape=(total, len(row))))
        out[0][done[0]] = row
        done[0] += 1

    opts = dict(engine, mode=mode, predictor="heads")
    with quietly():  # the heads are being validated: no "not validated" warning
        async with Engine.open(layout, **opts) as eng:
            for w in windows:
                await forced_decode(eng, list(map(int, w)), prompt_len, sink)
    out[0].flush()
    del out[:]
    return np.load(path, mmap_mode="r")
