"""Stage 3, on-policy distillation: the routed int4 student samples, the fp teacher scores.

Per step, with probability `on_policy` the continuations are sampled by the
student itself in route mode; otherwise they are teacher samples (the stage-2
data). The teacher scores every token of the same sequences, and the loss over
continuation tokens t is (docs/lora.md):

  L = mean_t [ beta * KL(s_t || p_t) + (1 - beta) * KL(p_t || s_t) ]
      + tail_weight * mean_t TAIL_k(p_t, s_t)

  TAIL_k(p, s) = - sum_{v in T_k} p(v) log s(v) - p(R) log s(R)

with s the student and p the teacher next-token distributions, T_k the teacher's
top-k tokens at t, R = V minus T_k the tail, p(R) = 1 - sum_{T_k} p and
s(R) = 1 - sum_{T_k} s. beta = 1 is pure reverse KL (mode-seeking, the paper's
choice); TAIL_k is the student's likelihood of the teacher's top-k tokens plus
the tail as one lumped outcome, so the student keeps the teacher's tail mass
without being pulled towards every tail token.
"""

from __future__ import annotations

from typing import Any

import attrs
import mlx.core as mx
import mlx.nn as nn
import numpy as np

from edge0.routing.prerouter import PrerouterSet
from edge0.train import routed
from edge0.train.sft import SftConfig, continuation_mask, continuation_mean, fit, masked_mean


@attrs.frozen
class DistillConfig:
    """Stage-3 options on top of the shared loop settings."""

    loop: SftConfig
    on_policy: float = 1.0  # fraction of steps whose continuations the student samples
    beta: float = 1.0  # divergence mix: 1 = reverse KL(s||p), 0 = forward KL(p||s)
    tail_k: int = 8
    tail_weight: float = 0.5
    temperature: float = 1.0  # student sampling temperature
    gen_len: int = 32


def log_probs(logits: mx.array) -> mx.array:
    return nn.log_softmax(logits.astype(mx.float32), axis=-1)


def token_kl(logp: mx.array, logq: mx.array) -> mx.array:
    """KL(p || q) per position from log-probabilities (..., V) -> (...)."""
    return (mx.exp(logp) * (logp - logq)).sum(axis=-1)


def tail_term(teacher_lp: mx.array, student_lp: mx.array, k: int) -> mx.array:
    """TAIL_k per position: cross-entropy over the teacher's top-k tokens plus the lumped tail."""
    top = mx.stop_gradient(mx.argpartition(-teacher_lp, kth=k - 1, axis=-1)[..., :k])  # (..., k)
    p_top = mx.exp(mx.take_along_axis(teacher_lp, top, axis=-1))  # (..., k)
    ls_top = mx.take_along_axis(student_lp, top, axis=-1)  # (..., k)
    # Tail masses as log-sum-exps over the tail tokens (stable when a tail is tiny); the
    # large finite fill makes an empty tail (k = V) exactly zero, with no inf/nan gradient.
    in_top = mx.put_along_axis(mx.zeros(student_lp.shape, dtype=mx.bool_), top, mx.array(True), -1)
    p_tail = mx.exp(mx.logsumexp(mx.where(in_top, -1e9, teacher_lp), axis=-1))
    ls_tail = mx.logsumexp(mx.where(in_top, -1e9, student_lp), axis=-1)
    return -(p_top * ls_top).sum(axis=-1) - p_tail * ls_tail


def distill_loss(
    student_logits: mx.array, teacher_logits: mx.array, mask: mx.array, cfg: DistillConfig
) -> tuple[mx.array, dict[str, mx.array]]:
    """The stage-3 loss (scalar) and its parts, over positions where `mask` is 1."""
    ls, lt = log_probs(student_logits), mx.stop_gradient(log_probs(teacher_logits))
    rev = masked_mean(token_kl(ls, lt), mask)
    fwd = masked_mean(token_kl(lt, ls), mask)
    tail = masked_mean(tail_term(lt, ls, cfg.tail_k), mask)
    loss = cfg.beta * rev + (1.0 - cfg.beta) * fwd + cfg.tail_weight * tail
    return loss, {"reverse_kl": rev, "forward_kl": fwd, "tail": tail}


def heldout_kl(
    student: nn.Module,
    state: routed.RouteState,
    teacher: nn.Module,
    seqs: np.ndarray,
    prompt_len: int,
    batch: int,
    eos: tuple[int, ...] = (),
) -> float:
    """Mean reverse KL(student || teacher) over the continuation tokens of `seqs`."""

    def kl(inputs: mx.array, targets: mx.array) -> mx.array:
        ls, _ = routed.plan_logits(student, state, inputs, prefill=prompt_len)
        return token_kl(log_probs(ls), log_probs(teacher(inputs)))

    return continuation_mean(seqs, batch, prompt_len, eos, kl)


def train_distill(
    student: nn.Module,
    heads: PrerouterSet | None,
    teacher: nn.Module,
    prompts: np.ndarray,
    offpolicy: np.ndarray,
    heldout: np.ndarray,
    cfg: DistillConfig,
) -> dict[str, Any]:
    """Stage 3. `prompts` (N, P) seed on-policy samples; `offpolicy` (M, P + G) are teacher
    samples used on the other steps; `heldout` (H, P + G) scores the held-out reverse KL."""
    loop = cfg.loop
    prompt_len = prompts.shape[1]
    rng = np.random.default_rng(loop.seed)
    counts = {"on_policy_steps": 0}

    def prepare(model: nn.Module, state: routed.RouteState, step: int) -> Any:
        n = min(loop.batch, len(prompts))
        if rng.random() < cfg.on_policy:
            counts["on_policy_steps"] += 1
            p = mx.array(prompts[np.sort(rng.choice(len(prompts), size=n, replace=False))])
            seqs, plan = routed.generate(model, state, p, cfg.gen_len, cfg.temperature)
            seqs = seqs[:, :-1]  # inputs; the last sampled token is never fed
        else:
            rows = offpolicy[np.sort(rng.choice(len(offpolicy), size=n, replace=False))]
            seqs = mx.array(rows)[:, :-1]
            _, plan = routed.plan_logits(model, state, seqs, prefill=prompt_len)
        teacher_logits = teacher(seqs)
        mask = continuation_mask(seqs, prompt_len, loop.eos)
        mx.eval(teacher_logits, mask)
        return seqs, plan, teacher_logits, mask

    def loss_fn(model: nn.Module, state: routed.RouteState, batch: Any) -> mx.array:
        seqs, plan, teacher_logits, mask = batch
        logits = routed.replay_logits(model, state, seqs, plan)
        return distill_loss(logits, teacher_logits, mask, cfg)[0]

    def evaluate(model: nn.Module, state: routed.RouteState) -> float:
        return heldout_kl(model, state, teacher, heldout, prompt_len, loop.batch, loop.eos)

    summary = fit(student, heads, loop, prepare, loss_fn, evaluate, "distill")
    summary.update(counts)
    summary["hparams"] = attrs.asdict(cfg)
    return summary
