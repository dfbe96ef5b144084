"""Tiny random checkpoints of every supported family, in the tensor layout transformers writes.

A fixture is (config, tensor layout): the config comes from transformers' own config
class, the layout (names and shapes) from transformers' `save_pretrained` of that
config (needs torch; `layout_from_transformers`). Values are a pure function of the
tensor name, so `write_family` rebuilds the same checkpoint byte for byte from the
committed fixture (tests/fixtures/families/<model_type>.json) without torch.
"""

from __future__ import annotations

import json
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from edge0.synth.tiny import SPECIAL_TOKENS, build_tokenizer

TOKENIZER_VOCAB = 300
D, FF, HEADS, KV, HEAD_DIM, LAYERS = 64, 32, 4, 2, 16, 3
EOS = SPECIAL_TOKENS.index("<|im_end|>")


def _common(vocab: int) -> dict[str, Any]:
    return dict(
        vocab_size=vocab,
        hidden_size=D,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        max_position_embeddings=256,
        eos_token_id=EOS,
        bos_token_id=None,
        pad_token_id=0,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
    )


def _mixtral(vocab: int) -> Any:
    from transformers import MixtralConfig

    return MixtralConfig(
        **_common(vocab),
        intermediate_size=FF,
        num_key_value_heads=KV,
        num_local_experts=8,
        num_experts_per_tok=2,
    )


def _olmoe(vocab: int) -> Any:
    from transformers import OlmoeConfig

    return OlmoeConfig(
        **_common(vocab),
        intermediate_size=FF,
        num_key_value_heads=KV,
        num_experts=8,
        num_experts_per_tok=2,
    )


def _qwen2_moe(vocab: int) -> Any:
    from transformers import Qwen2MoeConfig

    return Qwen2MoeConfig(
        **_common(vocab),
        intermediate_size=2 * FF,
        num_key_value_heads=KV,
        moe_intermediate_size=FF,
        shared_expert_intermediate_size=FF,
        num_experts=8,
        num_experts_per_tok=2,
    )


def _deepseek_v3(vocab: int) -> Any:
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        **_common(vocab),
        intermediate_size=2 * FF,
        moe_intermediate_size=FF,
        num_key_value_heads=HEADS,
        n_routed_experts=8,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        first_k_dense_replace=1,
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_rope_head_dim=16,
        qk_nope_head_dim=16,
        v_head_dim=16,
    )


def _deepseek_v2(vocab: int) -> Any:
    from transformers import DeepseekV2Config

    return DeepseekV2Config(
        **_common(vocab),
        intermediate_size=2 * FF,
        moe_intermediate_size=FF,
        num_key_value_heads=HEADS,
        n_routed_experts=8,
        n_shared_experts=1,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        q_lora_rank=None,
        kv_lora_rank=32,
        qk_rope_head_dim=16,
        qk_nope_head_dim=16,
        v_head_dim=16,
        topk_method="group_limited_greedy",
        n_group=2,
        topk_group=1,
        routed_scaling_factor=1.5,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 0.707,
            "mscale_all_dim": 0.707,
        },
    )


def _kimi_k2(vocab: int) -> Any:
    """Kimi-K2: DeepSeek-V3's architecture under its own model_type (one group, scaled 2.827)."""
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        **_common(vocab),
        intermediate_size=2 * FF,
        moe_intermediate_size=FF,
        num_key_value_heads=HEADS,
        n_routed_experts=8,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        routed_scaling_factor=2.827,
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_rope_head_dim=16,
        qk_nope_head_dim=16,
        v_head_dim=16,
    )


def _glm4_moe(vocab: int) -> Any:
    from transformers import Glm4MoeConfig

    return Glm4MoeConfig(
        **_common(vocab),
        intermediate_size=2 * FF,
        moe_intermediate_size=FF,  # type: ignore[call-arg]
        num_key_value_heads=KV,
        head_dim=HEAD_DIM,
        n_routed_experts=8,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        first_k_dense_replace=1,
        routed_scaling_factor=1.5,
    )


def _qwen3_moe(vocab: int) -> Any:
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        **_common(vocab),
        intermediate_size=2 * FF,
        num_key_value_heads=KV,
        head_dim=HEAD_DIM,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=FF,
        norm_topk_prob=True,
    )  # type: ignore[call-arg]


def _qwen3_next(vocab: int) -> Any:
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(
        **dict(_common(vocab), num_hidden_layers=4),
        intermediate_size=2 * FF,
        num_key_value_heads=KV,
        head_dim=HEAD_DIM,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=FF,
        shared_expert_intermediate_size=FF,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        norm_topk_prob=True,
    )


def _gpt_oss(vocab: int) -> Any:
    from transformers import GptOssConfig

    # gpt-oss-20b's rope (YaRN x32 over 4096) with `truncate: true` (mlx-lm's own rounding);
    # the hub's `truncate: false` is the gpt_oss-variant fixture (edge0/model/rope.py);
    # sliding window 4 so the prompt crosses it
    rope = {
        "rope_type": "yarn",
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": True,
        "original_max_position_embeddings": 4096,
        "rope_theta": 150000.0,
    }
    return GptOssConfig(
        **dict(_common(vocab), num_hidden_layers=4, max_position_embeddings=131072),
        intermediate_size=FF,
        num_key_value_heads=KV,
        head_dim=HEAD_DIM,
        num_local_experts=8,
        num_experts_per_tok=2,
        sliding_window=4,
        rope_parameters=rope,
    )


def _granitemoe(vocab: int) -> Any:
    from transformers import GraniteMoeConfig

    # experts 64 wide: mlx-lm quantizes their down_proj at 8 bits in groups of 64 (its predicate)
    return GraniteMoeConfig(
        **_common(vocab),
        intermediate_size=2 * FF,
        num_key_value_heads=KV,
        num_local_experts=8,
        num_experts_per_tok=2,
        embedding_multiplier=12.0,
        logits_scaling=8.0,
        residual_multiplier=0.22,
        attention_multiplier=0.0625,
    )


def _llama4(vocab: int) -> Any:
    """Llama-4 (Scout's text model, 4 layers): MoE every 2nd layer, NoPE every 4th; chunks of
    4 tokens and a temperature floor of 4 so the prompt crosses both; a tiny vision tower."""
    from transformers import Llama4Config

    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 16.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    text = dict(
        **dict(_common(vocab), num_hidden_layers=4, rms_norm_eps=1e-5),
        intermediate_size=FF,
        intermediate_size_mlp=2 * FF,
        num_key_value_heads=KV,
        head_dim=HEAD_DIM,
        num_local_experts=8,
        num_experts_per_tok=1,
        interleave_moe_layer_step=2,
        attention_chunk_size=4,
        floor_scale=4,
        attn_scale=0.1,
        use_qk_norm=True,
        rope_parameters=rope,
    )
    vision = dict(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        vision_output_dim=32,
        image_size=28,
        patch_size=14,
        projector_input_dim=32,
        projector_output_dim=32,
    )
    return Llama4Config(text_config=text, vision_config=vision, tie_word_embeddings=False)


CONFIGS: dict[str, Callable[[int], Any]] = {
    "mixtral": _mixtral,
    "olmoe": _olmoe,
    "qwen2_moe": _qwen2_moe,
    "deepseek_v3": _deepseek_v3,
    "deepseek_v2": _deepseek_v2,
    "glm4_moe": _glm4_moe,
    "qwen3_next": _qwen3_next,
    "gpt_oss": _gpt_oss,
    "kimi_k2": _kimi_k2,
    "granitemoe": _granitemoe,
    "llama4": _llama4,
}


def _qwen3_5_moe(vocab: int) -> Any:
    """Qwen3.5-MoE (the hub's multimodal config, text model only): DeltaNet, then attention."""
    from transformers import Qwen3_5MoeConfig

    text = dict(
        **dict(_common(vocab), num_hidden_layers=4),
        num_key_value_heads=KV,
        head_dim=HEAD_DIM,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=FF,
        shared_expert_intermediate_size=FF,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
    )
    vision = dict(
        depth=1,
        hidden_size=16,
        num_heads=2,
        intermediate_size=32,
        out_hidden_size=D,
        patch_size=14,
        temporal_patch_size=2,
        spatial_merge_size=2,
    )
    return Qwen3_5MoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=False)


# bases of config variants (VARIANTS) that are not family fixtures of their own
BASES: dict[str, Callable[[int], Any]] = {
    **CONFIGS,
    "qwen3_moe": _qwen3_moe,
    "qwen3_5_moe": _qwen3_5_moe,
}
# model_types transformers has no class of its own for: the architecture it runs them as
REFERENCE_TYPES = {"kimi_k2": "deepseek_v3"}
# transformers classes of the checkpoint (AutoModelForCausalLM otherwise): the hub's llama4
# releases are the multimodal model, whose `language_model` the text-only fixture exercises
REFERENCE_CLASSES = {
    "llama4": "Llama4ForConditionalGeneration",
    "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
}


def config_dict(
    model_type: str, vocab: int, changes: dict[str, Any] | None = None
) -> dict[str, Any]:
    """config.json of the tiny `model_type` checkpoint (transformers' to_dict, bf16).

    `changes` (a variant's config values; "text_config.KEY" reaches into a nested text
    config) are applied, then the dict goes through transformers' config class again so
    the values it derives from them (e.g. `sliding_window` from `use_sliding_window`) follow.
    """
    out: dict[str, Any] = BASES[model_type](vocab).to_dict()
    if changes:
        import transformers

        for key, value in changes.items():
            owner = out
            *path, leaf = key.split(".")
            for step in path:
                owner = owner[step]
            owner[leaf] = value
        ref = dict(out, model_type=REFERENCE_TYPES.get(model_type, model_type))
        out = transformers.AutoConfig.for_model(**ref).to_dict()
    out["dtype"] = "bfloat16"
    out["model_type"] = model_type
    return out


def layout_from_transformers(config: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    """Tensor names and shapes of transformers' own `save_pretrained` of `config` (torch)."""
    import torch
    import transformers
    from safetensors import safe_open

    model_type = config["model_type"]
    config = dict(config, model_type=REFERENCE_TYPES.get(model_type, model_type))
    cfg = transformers.AutoConfig.for_model(**config)
    torch.manual_seed(0)
    cls = getattr(transformers, REFERENCE_CLASSES.get(model_type, "AutoModelForCausalLM"))
    model = cls.from_config(cfg) if hasattr(cls, "from_config") else cls._from_config(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        with safe_open(str(Path(tmp) / "model.safetensors"), "pt") as f:
            return sorted((k, tuple(f.get_slice(k).get_shape())) for k in f.keys())


# families whose RMSNorms multiply by (1 + w): their norm weights are zero-centred
CENTRED_NORMS = ("qwen3_next", "qwen3_5_moe")


def values(name: str, shape: tuple[int, ...], centred: bool = False) -> np.ndarray:
    """Deterministic float32 values of one tensor, from its name alone."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    z = rng.standard_normal(shape).astype(np.float32)
    if len(shape) == 1:
        if "norm" in name and not (centred and not name.endswith("linear_attn.norm.weight")):
            return 1.0 + 0.1 * z
        return 0.1 * z
    gain = 1.0
    routers = (
        "mlp.gate.weight",
        "block_sparse_moe.gate.weight",
        "router.weight",
        "router.layer.weight",
    )
    if name.endswith(routers):
        gain = 2.0  # decisive routing: no near-ties between fp32 implementations
    elif name.endswith("experts.gate_up_proj"):
        gain = 6.0  # gpt-oss: pre-activations past swiglu_limit, so the clamps take effect
    elif name.endswith("lm_head.weight"):
        gain = 1.5
    elif name.endswith("embed_tokens.weight"):
        return z
    return z * (gain / np.sqrt(shape[-1]))


def fixture_file(root: Path, model_type: str) -> Path:
    return root / "families" / f"{model_type}.json"


def variant_spec(model_type: str, changes: dict[str, Any] | None = None) -> dict[str, Any]:
    """`model_type`'s fixture with config `changes`: config and transformers' layout (torch)."""
    with tempfile.TemporaryDirectory() as tmp:
        vocab = build_tokenizer(Path(tmp), TOKENIZER_VOCAB)
    config = config_dict(model_type, vocab, changes)
    layout = layout_from_transformers(config)
    return {"config": config, "tensors": [[n, list(s)] for n, s in layout]}


def write_fixture(
    root: Path, model_type: str, changes: dict[str, Any] | None = None, name: str | None = None
) -> Path:
    """Write tests/fixtures/families/<name>.json (config + transformers' layout)."""
    out = fixture_file(root, name or model_type)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(variant_spec(model_type, changes), indent=1) + "\n")
    return out


def write_variant(model_type: str, changes: dict[str, Any], out: Path) -> Path:
    """The tiny checkpoint of `model_type` with config `changes` in `out` (torch)."""
    return write_spec(variant_spec(model_type, changes), out)


def write_family(fixture: Path, out: Path) -> Path:
    """Write the tiny checkpoint of a committed fixture into `out` (bf16, tokenizer, config)."""
    return write_spec(json.loads(fixture.read_text()), out)


def write_spec(spec: dict[str, Any], out: Path) -> Path:
    """Write the checkpoint of a fixture spec ({"config", "tensors"}) into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    vocab = build_tokenizer(out, TOKENIZER_VOCAB)
    config = spec["config"]
    if vocab != (config.get("text_config") or config)["vocab_size"]:
        raise ValueError(f"{out}: tokenizer has {vocab} tokens, not the config's vocab_size")
    centred = config["model_type"] in CENTRED_NORMS
    tensors = {
        name: mx.array(values(name, tuple(shape), centred)).astype(mx.bfloat16)
        for name, shape in spec["tensors"]
    }
    mx.save_safetensors(str(out / "model.safetensors"), tensors, metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out
