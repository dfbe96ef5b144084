"""Stage 2: student-path SFT: the int4 student, routed by the prerouter, learns teacher samples."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs
import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from tqdm import tqdm

from edge0.log import get_logger
from edge0.model import lora
from edge0.routing.prerouter import PrerouterSet
from edge0.train import routed

log = get_logger(__name__)


@attrs.frozen
class SftConfig:
    """Hyper-parameters of one SFT run (stage 2)."""

    k: int  # routing capacity of the student in route mode
    steps: int = 200
    batch: int = 4  # sequences per step
    lr: float = 2e-4
    weight_decay: float = 0.0
    eval_every: int = 25
    max_minutes: float | None = None
    seed: int = 0
    eos: tuple[int, ...] = ()  # end-of-text ids: continuation tokens after one are not learned
    wrap: bool | None = None  # first MoE layer routed by the wrap head (None: heads' config)


def teacher_samples(
    teacher: nn.Module, prompts: np.ndarray, gen_len: int, temperature: float, batch: int
) -> np.ndarray:
    """(N, P) prompts -> (N, P + gen_len) teacher continuations sampled at `temperature`."""
    out = []
    steps = range(0, len(prompts), batch)
    for i in tqdm(steps, desc="teacher samples", unit="batch", disable=None):  # bar on a tty
        seq, _ = routed.generate(
            teacher, None, mx.array(prompts[i : i + batch]), gen_len, temperature
        )
        out.append(np.array(seq))
    return np.concatenate(out).astype(np.int32)


def continuation_mask(inputs: mx.array, prompt_len: int, eos: tuple[int, ...] = ()) -> mx.array:
    """(B, L) float mask over the predictions made at each input position (target i + 1).

    1 where the target is a continuation token (i + 1 >= prompt_len) and no end-of-text
    token appears in the continuation up to and including input i (what follows an
    end of text is never served, so it is not learned).
    """
    pos = mx.arange(inputs.shape[1])[None, :]  # (1, L)
    mask = pos + 1 >= prompt_len
    if eos:
        hit = mx.zeros(inputs.shape, dtype=mx.bool_)
        for e in eos:
            hit = hit | (inputs == e)
        seen = mx.cumsum((hit & (pos >= prompt_len)).astype(mx.int32), axis=1)
        mask = mask & (seen == 0)
    return mx.broadcast_to(mask, inputs.shape).astype(mx.float32)


def masked_mean(x: mx.array, mask: mx.array) -> mx.array:
    return (x * mask).sum() / mx.maximum(mask.sum(), 1.0)


def sft_loss(
    model: nn.Module,
    state: routed.RouteState,
    seqs: mx.array,
    plan: routed.Plan,
    prompt_len: int,
    eos: tuple[int, ...] = (),
) -> mx.array:
    """Mean cross-entropy of the continuation tokens under route mode, executing `plan`."""
    logits = routed.replay_logits(model, state, seqs[:, :-1], plan).astype(mx.float32)
    ce = nn.losses.cross_entropy(logits, seqs[:, 1:], reduction="none")  # (B, S-1)
    return masked_mean(ce, continuation_mask(seqs[:, :-1], prompt_len, eos))


def heldout_loss(
    model: nn.Module,
    state: routed.RouteState,
    seqs: np.ndarray,
    prompt_len: int,
    batch: int,
    eos: tuple[int, ...] = (),
) -> float:
    """Route-mode continuation cross-entropy over `seqs` (nats/token)."""

    def ce(inputs: mx.array, targets: mx.array) -> mx.array:
        logits, _ = routed.plan_logits(model, state, inputs, prefill=prompt_len)
        return nn.losses.cross_entropy(logits.astype(mx.float32), targets, reduction="none")

    return continuation_mean(seqs, batch, prompt_len, eos, ce)


def continuation_mean(
    seqs: np.ndarray,
    batch: int,
    prompt_len: int,
    eos: tuple[int, ...],
    per_token: Callable[[mx.array, mx.array], mx.array],
) -> float:
    """Mean of `per_token(inputs, targets)` (B, T) over the continuation tokens of `seqs`."""
    total = count = 0.0
    for i in range(0, len(seqs), batch):
        s = mx.array(seqs[i : i + batch])
        inputs = s[:, :-1]
        mask = continuation_mask(inputs, prompt_len, eos)
        total += float((per_token(inputs, s[:, 1:]) * mask).sum())
        count += float(mask.sum())
    return total / max(count, 1.0)


Prepare = Callable[[nn.Module, routed.RouteState, int], Any]
LossFn = Callable[[nn.Module, routed.RouteState, Any], mx.array]


def fit(
    student: nn.Module,
    heads: PrerouterSet | None,
    cfg: SftConfig,
    prepare: Prepare,
    loss_fn: LossFn,
    evaluate: Callable[[nn.Module, routed.RouteState], float],
    desc: str,
) -> dict[str, Any]:
    """Shared LoRA loop: AdamW on the adapters only, held-out eval, best weights kept.

    Per step, `prepare(model, state, step)` builds the batch outside the gradient
    (route-mode plans, samples, teacher scores); `loss_fn(model, state, batch)` is
    differentiated w.r.t. the adapters; `evaluate` gives the held-out figure (lower is
    better). The student must already carry adapters (edge0.model.lora.apply_lora / load).
    """
    mx.random.seed(cfg.seed)
    trainable = lora.mark_trainable(student)
    student.eval()
    opt = optim.AdamW(learning_rate=cfg.lr, weight_decay=cfg.weight_decay)
    start = time.perf_counter()
    history: list[dict[str, float]] = []
    with routed.routed(student, heads, cfg.k, wrap=cfg.wrap) as state:
        grad_fn = nn.value_and_grad(student, lambda m, b: loss_fn(m, state, b))
        best = first = evaluate(student, state)
        best_weights = lora.adapter_weights(student)
        bar = tqdm(range(cfg.steps), desc=desc, unit="step", disable=None)
        for step in bar:
            batch = prepare(student, state, step)  # eval mode: sets as the runtime picks them
            student.train()  # LoRA dropout (if any) only in the differentiated pass
            loss, grads = grad_fn(student, batch)
            student.eval()
            opt.update(student, grads)
            mx.eval(loss, student.trainable_parameters(), opt.state)
            row = {"step": step + 1, "loss": float(loss)}
            last = step + 1 == cfg.steps
            elapsed = time.perf_counter() - start
            timed_out = cfg.max_minutes is not None and elapsed > 60 * cfg.max_minutes
            if (step + 1) % cfg.eval_every == 0 or last or timed_out:
                row["heldout"] = evaluate(student, state)
                if row["heldout"] < best:
                    best, best_weights = row["heldout"], lora.adapter_weights(student)
                bar.set_postfix(loss=f"{row['loss']:.3f}", heldout=f"{row['heldout']:.3f}")
                log.info(f"{desc}.eval", **row)
            history.append(row)
            if timed_out:
                break
        student.load_weights(list(best_weights.items()), strict=False)
        mx.eval(student.parameters())
    return {
        "trainable_params": trainable,
        "steps": len(history),
        "heldout_before": first,
        "heldout_best": best,
        "seconds": round(time.perf_counter() - start, 1),
        "history": history,
        "hparams": attrs.asdict(cfg),
    }


def train_sft(
    student: nn.Module,
    heads: PrerouterSet | None,
    train: np.ndarray,
    heldout: np.ndarray,
    prompt_len: int,
    cfg: SftConfig,
) -> dict[str, Any]:
    """Stage 2 on teacher samples (N, P + G); returns a summary (held-out CE before/best)."""
    rng = np.random.default_rng(cfg.seed)

    def prepare(model: nn.Module, state: routed.RouteState, step: int) -> Any:
        pick = rng.choice(len(train), size=min(cfg.batch, len(train)), replace=False)
        seqs = mx.array(train[np.sort(pick)])
        # the sets the runtime would execute under the current weights (prompt prefilled)
        _, plan = routed.plan_logits(model, state, seqs[:, :-1], prefill=prompt_len)
        return seqs, plan

    def loss_fn(model: nn.Module, state: routed.RouteState, batch: Any) -> mx.array:
        seqs, plan = batch
        return sft_loss(model, state, seqs, plan, prompt_len, cfg.eos)

    def evaluate(model: nn.Module, state: routed.RouteState) -> float:
        return heldout_loss(model, state, heldout, prompt_len, cfg.batch, cfg.eos)

    return fit(student, heads, cfg, prepare, loss_fn, evaluate, "sft")
