"""Routing families: the streaming block reproduces each mlx-lm sparse block bit for bit."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
import pytest

from edge0.families import FAMILIES, family_for
from edge0.kernels.layers import use_native
from edge0.runtime.compute.steps import Steps
from edge0.runtime.io.trace import Tracer
from edge0.runtime.layers.block import StreamingMoE
from edge0.runtime.layers.streams import LayerStream, ResidentExperts

D, FF, E, K = 64, 64, 8, 2


def _blocks() -> dict[str, Any]:
    from mlx_lm.models import deepseek_v3, mixtral, qwen3_moe, qwen3_next

    q3 = qwen3_moe.ModelArgs(
        model_type="qwen3_moe",
        hidden_size=D,
        num_hidden_layers=1,
        intermediate_size=FF,
        num_attention_heads=4,
        num_experts=E,
        num_experts_per_tok=K,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        moe_intermediate_size=FF,
        rms_norm_eps=1e-6,
        vocab_size=32,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=1e4,
        tie_word_embeddings=False,
        max_position_embeddings=64,
        norm_topk_prob=True,
    )
    nxt = qwen3_next.ModelArgs(
        model_type="qwen3_next",
        hidden_size=D,
        num_hidden_layers=1,
        intermediate_size=FF,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        vocab_size=32,
        num_experts=E,
        num_experts_per_tok=K,
        decoder_sparse_step=1,
        shared_expert_intermediate_size=FF,
        moe_intermediate_size=FF,
        mlp_only_layers=[],
        linear_num_value_heads=2,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        full_attention_interval=4,
        tie_word_embeddings=False,
        rope_theta=1e4,
        partial_rotary_factor=0.25,
        max_position_embeddings=64,
        norm_topk_prob=True,
    )
    mix = mixtral.ModelArgs(
        model_type="mixtral",
        hidden_size=D,
        intermediate_size=FF,
        num_local_experts=E,
        num_experts_per_tok=K,
    )
    ds = deepseek_v3.ModelArgs(
        hidden_size=D,
        moe_intermediate_size=FF,
        n_routed_experts=E,
        num_experts_per_tok=K,
        n_shared_experts=1,
        n_group=2,
        topk_group=1,
        routed_scaling_factor=2.5,
    )
    return {
        "qwen3_moe": qwen3_moe.Qwen3MoeSparseMoeBlock(q3),
        "qwen3_next": qwen3_next.Qwen3NextSparseMoeBlock(nxt),
        "mixtral": mixtral.MixtralSparseMoeBlock(mix),
        "deepseek_v3": deepseek_v3.DeepseekV3MoE(ds),
    }


def _resident_stream(block: nn.Module) -> LayerStream:
    sw = block.switch_mlp
    views = {
        f"{p}.{part}": getattr(getattr(sw, p), part)
        for p in ("gate_proj", "up_proj", "down_proj")
        for part in ("weight", "scales", "biases")
    }
    steps = Steps("reactive", K, Tracer())
    return LayerStream(0, steps, ResidentExperts(views), {"group_size": 32, "bits": 4})


@pytest.mark.parametrize("model_type", ["qwen3_moe", "qwen3_next", "mixtral", "deepseek_v3"])
def test_streaming_block_equals_the_mlx_lm_block(model_type: str) -> None:
    mx.random.seed(3)
    block = _blocks()[model_type]
    if model_type == "deepseek_v3":  # give the correction bias something to do
        block.gate.weight = mx.random.normal((E, D)) * 0.3
        block.gate.e_score_correction_bias = mx.random.normal((E,)) * 0.1
    nn.quantize(block.switch_mlp, group_size=32, bits=4)
    use_native(block)  # as a loaded model runs it (edge0.kernels)
    mx.eval(block.parameters())
    stream = StreamingMoE(block, 0, family_for(model_type), _resident_stream(block))
    for _ in range(5):
        x = mx.random.normal((1, 1, D))
        assert mx.array_equal(stream(x), block(x)).item(), model_type


@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral", "deepseek_v3"])
def test_weights_of_the_true_set_equal_the_routing_weights(model_type: str) -> None:
    """Route mode's gate-weight rule, given the true set, reproduces the router's weights."""
    mx.random.seed(4)
    block = _blocks()[model_type]
    fam = family_for(model_type)
    for _ in range(5):
        x = mx.random.normal((1, 1, D))
        scores = fam.scores(block, x)
        inds, w = fam.select(block, scores, K)
        assert mx.allclose(fam.weights(block, scores, inds), w, atol=1e-6).item()


def test_unknown_family_is_a_clear_error() -> None:
    from edge0.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="not a supported MoE family"):
        family_for("gpt2")
    assert "qwen3_5_moe" in FAMILIES
