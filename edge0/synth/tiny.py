"""Tiny random HF-format MoE checkpoints (qwen3_moe, qwen3_5_moe) for tests and the demo."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import numpy as np

from edge0.synth.shapes import SHAPE_FAMILIES as SUPPORTED
from edge0.synth.shapes import Shape
from edge0.synth.shapes import hf_config as shape_hf_config

# A fixed text to train the tiny byte-level BPE tokenizer on (written for Edge0).
TOKENIZER_TEXT = """\
Edge0 runs mixture-of-experts language models that do not fit in memory.
The resident weights stay in memory while the expert weights stream from disk.
A small prerouter predicts the experts of the next layer one token ahead,
so the reads start a whole decode step before the compute needs them.
def fibonacci(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a
class Cache:
    def __init__(self, size):
        self.size = size
        self.items = {}
    def get(self, key, default=None):
        return self.items.get(key, default)
The quick brown fox jumps over the lazy dog. Hello world! How are you today?
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. Symbols: ( ) [ ] { } < > = + - * / % # @ : ; , . ' "
"""
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Output-head scale: logits of roughly +-5. The fp32 noise floor of the reference itself
# (transformers' chunked vs recurrent Gated DeltaNet paths) grows with the logit scale;
# at +-15 it reaches 7e-5, too close to the 1e-4 reference tolerance.
LM_HEAD_GAIN = 1.5
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@attrs.frozen
class TinySpec(Shape):
    """Shape of a tiny random checkpoint; the vocabulary size comes from the tokenizer."""

    max_positions: int = 256
    tokenizer_vocab: int = 512
    seed: int = 0


def build_tokenizer(out: Path, vocab_size: int) -> int:
    """Train a byte-level BPE on TOKENIZER_TEXT, write tokenizer files; return its size."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    # Qwen's split pattern then byte-level: what transformers' Qwen3_5Tokenizer imposes
    # anyway, so the tokenizer.json and transformers' tokenizer encode alike.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TOKENIZER_TEXT], trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "model_max_length": 1 << 20,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    return int(tok.get_vocab_size())


def hf_config(spec: TinySpec, vocab: int, eos_id: int) -> dict[str, Any]:
    """The config.json dict (edge0.synth.shapes builds it with transformers' config classes)."""
    if spec.model_type not in SUPPORTED:
        raise ValueError(f"tiny checkpoints exist for {SUPPORTED}, not {spec.model_type!r}")
    return shape_hf_config(
        spec, vocab, max_position_embeddings=spec.max_positions, eos_token_id=eos_id
    )


def _qwen3_moe_weights(spec: TinySpec, vocab: int, rng: np.random.Generator) -> dict[str, Any]:
    d, hd = spec.hidden, spec.head_dim
    w = _Init(rng)
    t: dict[str, Any] = {"model.embed_tokens.weight": w.normal((vocab, d), 1.0)}
    for i in range(spec.layers):
        p = f"model.layers.{i}"
        t[f"{p}.input_layernorm.weight"] = w.norm(d, center=1.0)
        t[f"{p}.post_attention_layernorm.weight"] = w.norm(d, center=1.0)
        t[f"{p}.self_attn.q_proj.weight"] = w.linear(spec.heads * hd, d)
        t[f"{p}.self_attn.k_proj.weight"] = w.linear(spec.kv_heads * hd, d)
        t[f"{p}.self_attn.v_proj.weight"] = w.linear(spec.kv_heads * hd, d)
        t[f"{p}.self_attn.o_proj.weight"] = w.linear(d, spec.heads * hd)
        t[f"{p}.self_attn.q_norm.weight"] = w.norm(hd, center=1.0)
        t[f"{p}.self_attn.k_norm.weight"] = w.norm(hd, center=1.0)
        t[f"{p}.mlp.gate.weight"] = w.linear(spec.experts, d, gain=2.0)
        for e in range(spec.experts):
            t[f"{p}.mlp.experts.{e}.gate_proj.weight"] = w.linear(spec.moe_ff, d)
            t[f"{p}.mlp.experts.{e}.up_proj.weight"] = w.linear(spec.moe_ff, d)
            t[f"{p}.mlp.experts.{e}.down_proj.weight"] = w.linear(d, spec.moe_ff)
    t["model.norm.weight"] = w.norm(d, center=1.0)
    t["lm_head.weight"] = w.linear(vocab, d, gain=LM_HEAD_GAIN)
    return t


def _qwen3_5_moe_weights(spec: TinySpec, vocab: int, rng: np.random.Generator) -> dict[str, Any]:
    # Layout of the released Qwen3.5 MoE checkpoints: "model.language_model." prefix, fused
    # experts (gate_up_proj (E, 2F, D), down_proj (E, D, F)), zero-centred RMSNorm weights
    # (the norm multiplies by 1 + w), conv1d weight (C, 1, K). No vision tower weights.
    d, hd, e, f = spec.hidden, spec.head_dim, spec.experts, spec.moe_ff
    kd, vd = spec.lin_k_heads * spec.lin_head_dim, spec.lin_v_heads * spec.lin_head_dim
    w = _Init(rng)
    m = "model.language_model"
    t: dict[str, Any] = {f"{m}.embed_tokens.weight": w.normal((vocab, d), 1.0)}
    for i in range(spec.layers):
        p = f"{m}.layers.{i}"
        t[f"{p}.input_layernorm.weight"] = w.norm(d, center=0.0)
        t[f"{p}.post_attention_layernorm.weight"] = w.norm(d, center=0.0)
        if (i + 1) % 4 != 0:  # Gated DeltaNet (linear attention)
            a = f"{p}.linear_attn"
            conv = 2 * kd + vd
            t[f"{a}.in_proj_qkv.weight"] = w.linear(conv, d)
            t[f"{a}.in_proj_z.weight"] = w.linear(vd, d)
            t[f"{a}.in_proj_b.weight"] = w.linear(spec.lin_v_heads, d)
            t[f"{a}.in_proj_a.weight"] = w.linear(spec.lin_v_heads, d)
            t[f"{a}.conv1d.weight"] = w.normal((conv, 1, 4), 0.5)  # (C, 1, K)
            t[f"{a}.dt_bias"] = w.norm(spec.lin_v_heads, center=1.0)
            t[f"{a}.A_log"] = np.log(rng.uniform(1.0, 16.0, spec.lin_v_heads)).astype(np.float32)
            t[f"{a}.norm.weight"] = w.norm(spec.lin_head_dim, center=1.0)
            t[f"{a}.out_proj.weight"] = w.linear(d, vd)
        else:  # gated full attention: q_proj emits the query and its output gate
            a = f"{p}.self_attn"
            t[f"{a}.q_proj.weight"] = w.linear(2 * spec.heads * hd, d)
            t[f"{a}.k_proj.weight"] = w.linear(spec.kv_heads * hd, d)
            t[f"{a}.v_proj.weight"] = w.linear(spec.kv_heads * hd, d)
            t[f"{a}.o_proj.weight"] = w.linear(d, spec.heads * hd)
            t[f"{a}.q_norm.weight"] = w.norm(hd, center=0.0)
            t[f"{a}.k_norm.weight"] = w.norm(hd, center=0.0)
        g = f"{p}.mlp"
        t[f"{g}.gate.weight"] = w.linear(e, d, gain=2.0)
        t[f"{g}.experts.gate_up_proj"] = np.stack([w.linear(2 * f, d) for _ in range(e)])
        t[f"{g}.experts.down_proj"] = np.stack([w.linear(d, f) for _ in range(e)])
        t[f"{g}.shared_expert.gate_proj.weight"] = w.linear(spec.shared_ff, d)
        t[f"{g}.shared_expert.up_proj.weight"] = w.linear(spec.shared_ff, d)
        t[f"{g}.shared_expert.down_proj.weight"] = w.linear(d, spec.shared_ff)
        t[f"{g}.shared_expert_gate.weight"] = w.linear(1, d)
    t[f"{m}.norm.weight"] = w.norm(d, center=0.0)
    t["lm_head.weight"] = w.linear(vocab, d, gain=LM_HEAD_GAIN)
    return t


@attrs.define
class _Init:
    """Deterministic random initialisers (float32 numpy)."""

    rng: np.random.Generator

    def normal(self, shape: tuple[int, ...], std: float) -> np.ndarray:
        return (self.rng.standard_normal(shape) * std).astype(np.float32)

    def linear(self, out_dim: int, in_dim: int, gain: float = 1.0) -> np.ndarray:
        return self.normal((out_dim, in_dim), gain / np.sqrt(in_dim))  # (out, in)

    def norm(self, dim: int, center: float) -> np.ndarray:
        return (center + self.rng.standard_normal(dim) * 0.1).astype(np.float32)


def write_checkpoint(spec: TinySpec, out: Path | str, shards: int = 1) -> Path:
    """Write a tiny random HF checkpoint (bf16 safetensors, tokenizer, config) into `out`.

    Args:
        spec: the shape and seed.
        out: target directory (created).
        shards: 1 writes model.safetensors; more writes model-0000i-of-0000n.safetensors
            plus model.safetensors.index.json, as sharded HF checkpoints do.

    Returns:
        The directory.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    vocab = build_tokenizer(out, spec.tokenizer_vocab)
    eos_id = SPECIAL_TOKENS.index("<|im_end|>")
    config = hf_config(spec, vocab, eos_id)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    rng = np.random.default_rng(spec.seed)
    make = _qwen3_moe_weights if spec.model_type == "qwen3_moe" else _qwen3_5_moe_weights
    tensors = {k: mx.array(v).astype(mx.bfloat16) for k, v in make(spec, vocab, rng).items()}
    _save(tensors, out, shards)
    return out


def _save(tensors: dict[str, mx.array], out: Path, shards: int) -> None:
    names = list(tensors)
    if shards <= 1:
        mx.save_safetensors(str(out / "model.safetensors"), tensors, metadata={"format": "pt"})
        return
    weight_map: dict[str, str] = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: tensors[k] for k in names[s::shards]}
        mx.save_safetensors(str(out / fname), part, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, fname))
    total = sum(v.nbytes for v in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


# The committed test fixtures (tests/fixtures/<model_type>/): spec and shard count.
FIXTURE_SPECS: dict[str, tuple[TinySpec, int]] = {
    "qwen3_moe": (TinySpec(model_type="qwen3_moe", layers=2, top_k=2), 2),
    "qwen3_5_moe": (TinySpec(model_type="qwen3_5_moe", layers=4, top_k=4), 1),
}
