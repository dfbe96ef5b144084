"""Route-mode student (plan == replay), SFT and distillation steps lower their losses."""

from __future__ import annotations

import lora_tiny as tiny
import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from edge0.model import lora
from edge0.routing.prerouter import PrerouterSet
from edge0.train import distill, routed, sft
from edge0.train.capture import recording

FAMILIES = [tiny.qwen3_moe_config, tiny.qwen3_5_moe_config]


@pytest.mark.parametrize("make", FAMILIES)
def test_route_mode_plan_equals_replay_and_true_routing_equals_resident(make):
    model = tiny.build(make())
    x = tiny.tokens(n=10)
    resident = np.array(model(x))
    with routed.routed(model, None, k=2) as state:  # no heads, K = top-k: true routing
        planned, plan = routed.plan_logits(model, state, x)
        np.testing.assert_allclose(np.array(planned), resident, rtol=1e-5, atol=1e-5)
    heads = PrerouterSet.from_model(model)
    with routed.routed(model, heads, k=1) as state:
        planned, plan = routed.plan_logits(model, state, x)
        assert all(v.shape == (2, 10, 1) for v in plan.values())
        replayed = routed.replay_logits(model, state, x, plan)
        np.testing.assert_allclose(np.array(replayed), np.array(planned), rtol=1e-5, atol=1e-5)
    assert not np.allclose(np.array(planned), resident, atol=1e-3)  # K=1 really reroutes
    assert type(model.layers[0].mlp).__name__ != "RoutedMoE"  # uninstalled


def test_route_mode_uses_the_heads_prediction():
    model = tiny.build(tiny.qwen3_moe_config())
    heads = PrerouterSet.from_model(model, wrap=False)
    x = tiny.tokens(n=6)
    with routed.routed(model, heads, k=1) as state:
        _, plan = routed.plan_logits(model, state, x)
    # Replay the decode by hand: layer 1 at token t+1 must run what layer 0's head
    # predicted at token t from layer 0's hidden and executed sets.
    with routed.routed(model, heads, k=1) as state, recording(model) as sink:
        state.reset()
        cache = make_prompt_cache(model)
        for t in range(x.shape[1] - 1):
            state.begin_step()
            model(x[:, t : t + 1], cache=cache)
            prev = plan[0][:, t - 1 : t] if t > 0 else None
            pred = heads.predict_topk(0, sink[0][0], plan[0][:, t : t + 1], prev, 1)
            assert np.array_equal(np.array(pred), np.array(plan[1][:, t + 1 : t + 2])), t
            # No head predicts layer 0 (wrap=False): it runs its true top-1.
            true0 = np.array(mx.argmax(sink[0][1], axis=-1))  # (B, 1)
            assert np.array_equal(true0, np.array(plan[0][:, t : t + 1, 0])), t


def _teacher_and_student(make):
    teacher = tiny.build(make(), quantize=False)
    student = tiny.build(make(), quantize=True)  # same seed: int4 copy of the teacher
    lora.apply_lora(student, lora.LoraConfig(rank=4, alpha=8))
    return teacher, student


@pytest.mark.parametrize("make", FAMILIES)
def test_one_sft_step_lowers_the_loss_on_a_fixed_batch(make):
    teacher, student = _teacher_and_student(make)
    heads = PrerouterSet.from_model(student)
    prompts = np.array(tiny.tokens(n=4, batch=3, seed=5))
    mx.random.seed(0)
    seqs = mx.array(sft.teacher_samples(teacher, prompts, 6, 1.0, batch=3))
    assert seqs.shape == (3, 10)
    lora.mark_trainable(student)
    opt = optim.Adam(learning_rate=1e-2)
    with routed.routed(student, heads, k=1) as state:
        _, plan = routed.plan_logits(student, state, seqs[:, :-1])

        def loss_fn(m):
            return sft.sft_loss(m, state, seqs, plan, prompt_len=4)

        before, grads = nn.value_and_grad(student, loss_fn)(student)
        names = {k for k, _ in tree_flatten(grads)}
        assert names and all(k.endswith(("lora_a", "lora_b")) for k in names)
        opt.update(student, grads)
        mx.eval(student.parameters())
        after = loss_fn(student)
    assert float(after) < float(before)


def test_train_sft_improves_heldout_and_saves(tmp_path):
    teacher, student = _teacher_and_student(tiny.qwen3_moe_config)
    heads = PrerouterSet.from_model(student)
    prompts = np.array(tiny.tokens(n=4, batch=8, seed=5))
    mx.random.seed(0)
    data = sft.teacher_samples(teacher, prompts, 8, 0.7, batch=8)
    cfg = sft.SftConfig(k=1, steps=6, batch=4, lr=1e-2, eval_every=3)
    summary = sft.train_sft(student, heads, data[:6], data[6:], 4, cfg)
    assert summary["steps"] == 6
    assert summary["heldout_best"] <= summary["heldout_before"]
    lora.save_adapters(student, tmp_path, lora.LoraConfig(rank=4, alpha=8))
    assert (tmp_path / lora.WEIGHTS_FILE).exists()


def test_distill_loss_parts():
    mx.random.seed(0)
    t = mx.random.normal((3, 5, 16)) * 2
    s = mx.random.normal((3, 5, 16)) * 2
    mask = mx.ones((3, 5))
    cfg = distill.DistillConfig(loop=sft.SftConfig(k=1), tail_k=16, tail_weight=1.0)
    same, parts = distill.distill_loss(t, t, mask, cfg)
    assert float(parts["reverse_kl"]) == pytest.approx(0.0, abs=1e-6)
    # With k = V the tail is empty: TAIL is the full cross-entropy H(p, s) = H(p) at s = p.
    lt, ls = distill.log_probs(t), distill.log_probs(s)
    ce = -(mx.exp(lt) * ls).sum(-1)
    np.testing.assert_allclose(np.array(distill.tail_term(lt, ls, 16)), np.array(ce), rtol=1e-5)
    assert float(same) == pytest.approx(float((-(mx.exp(lt) * lt).sum(-1)).mean()), rel=1e-5)
    # With k < V the tail is one lumped outcome: TAIL_k >= 0 and <= the full cross-entropy.
    tk = np.array(distill.tail_term(lt, ls, 4))
    assert (tk >= 0).all() and (tk <= np.array(ce) + 1e-5).all()
    # beta mixes reverse and forward KL.
    fwd_only = distill.DistillConfig(loop=sft.SftConfig(k=1), beta=0.0, tail_weight=0.0)
    loss, parts = distill.distill_loss(s, t, mask, fwd_only)
    assert float(loss) == pytest.approx(float(parts["forward_kl"]), rel=1e-6)
    assert float(parts["forward_kl"]) != pytest.approx(float(parts["reverse_kl"]), rel=1e-3)


@pytest.mark.parametrize("make", FAMILIES)
def test_one_distill_step_lowers_the_loss_on_a_fixed_on_policy_batch(make):
    teacher, student = _teacher_and_student(make)
    heads = PrerouterSet.from_model(student)
    cfg = distill.DistillConfig(loop=sft.SftConfig(k=1), tail_k=4)
    prompts = tiny.tokens(n=4, batch=3, seed=5)
    lora.mark_trainable(student)
    opt = optim.Adam(learning_rate=1e-2)
    with routed.routed(student, heads, k=1) as state:
        mx.random.seed(0)
        seqs, plan = routed.generate(student, state, prompts, 6, temperature=1.0)
        seqs = seqs[:, :-1]
        teacher_logits = teacher(seqs)
        mask = sft.continuation_mask(seqs, 4)

        def loss_fn(m):
            logits = routed.replay_logits(m, state, seqs, plan)
            return distill.distill_loss(logits, teacher_logits, mask, cfg)[0]

        before, grads = nn.value_and_grad(student, loss_fn)(student)
        opt.update(student, grads)
        mx.eval(student.parameters())
        after = loss_fn(student)
    assert float(after) < float(before)


def test_train_distill_runs_mixed_policy_and_tracks_heldout_kl():
    teacher, student = _teacher_and_student(tiny.qwen3_moe_config)
    heads = PrerouterSet.from_model(student)
    prompts = np.array(tiny.tokens(n=4, batch=8, seed=5))
    mx.random.seed(0)
    data = sft.teacher_samples(teacher, prompts, 6, 1.0, batch=8)
    cfg = distill.DistillConfig(
        loop=sft.SftConfig(k=1, steps=6, batch=3, lr=1e-2, eval_every=3), on_policy=0.5, gen_len=6
    )
    summary = distill.train_distill(student, heads, teacher, prompts[:6], data[:6], data[6:], cfg)
    assert 0 < summary["on_policy_steps"] < 6
    assert summary["heldout_best"] <= summary["heldout_before"]


def test_tail_term_gradients_stay_finite():
    mx.random.seed(1)
    t = distill.log_probs(mx.random.normal((2, 3, 16)))
    # A student that puts almost no mass on the tail (1 - sum_top underflows in fp32).
    s = mx.zeros((2, 3, 16))
    top = mx.argpartition(-t, kth=3, axis=-1)[..., :4]
    s = mx.put_along_axis(s, top, mx.array(60.0), -1)
    for k in (4, 16):
        g = mx.grad(lambda z, k=k: distill.tail_term(t, distill.log_probs(z), k).sum())(s)
        assert np.isfinite(np.array(g)).all(), k
    val = np.array(distill.tail_term(t, distill.log_probs(s), 4))
    assert np.isfinite(val).all() and (val > 10).all()  # the starved tail is penalised


def test_continuation_mask_stops_after_end_of_text():
    inputs = mx.array([[5, 6, 7, 8, 0, 9, 9], [5, 6, 0, 8, 9, 9, 9]])  # prompt_len 3, eos 0
    plain = np.array(sft.continuation_mask(inputs, 3))
    assert plain.tolist() == [[0, 0, 1, 1, 1, 1, 1]] * 2
    got = np.array(sft.continuation_mask(inputs, 3, eos=(0,)))
    # row 0: predictions at inputs 2..4 (targets 3..5); input 4 is EOS -> later ones dropped
    assert got.tolist() == [[0, 0, 1, 1, 0, 0, 0], [0, 0, 1, 1, 1, 1, 1]]
