"""The tiny fixtures' shared dimensions: each family's `tiny` config starts from these."""

from __future__ import annotations

from typing import Any

D, FF, HEADS, KV, HEAD_DIM, LAYERS = 64, 32, 4, 2, 16, 3
EOS = 2  # "<|im_end|>" in the fixtures' tokenizer (edge0.synth.tiny.SPECIAL_TOKENS)


def common(vocab: int, **changes: Any) -> dict[str, Any]:
    """The config fields every tiny fixture shares (`changes` override them)."""
    out: dict[str, Any] = dict(
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
    return out | changes
