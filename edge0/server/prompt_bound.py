"""A lower bound on a text's token count without tokenizing it: its UTF-8 bytes over the most
bytes one token can stand for.

A token of the vocabulary covers at most L bytes of the normalized text, where L is the
longest token's UTF-8 length, or its length in characters for a byte-level vocabulary
(each character stands for one byte); added tokens are matched on the raw text.
Normalization can shrink text: Unicode normalization and lowercasing map a character to
one of at most S = 4 times fewer bytes (a 4-byte mathematical letter to its 1-byte ASCII
form under NFKC; 3x for canonical forms: the Kelvin sign, Hangul jamo to a syllable). So

    tokens >= ceil(bytes / (S * L))

holds whenever no step of the tokenizer can drop text or fold a run of text into one
token. Pipelines with such a step have no bound (`None`): normalizers that strip or
replace text (strip, accents, regex replace, SentencePiece's precompiled maps, which
delete zero-width characters), pre-tokenizers that remove characters (whitespace splits,
`Removed` splits), and models that map an unknown word or a fused run of unknown
characters to one token (WordPiece, WordLevel, Unigram and BPE with a fused unk token).
"""

from __future__ import annotations

import json
import math
from typing import Any

import attrs

from edge0.log import get_logger

log = get_logger("edge0.server")
UNICODE_SHRINK = 4  # bytes in per byte out, at most, of NFC/NFD/NFKC/NFKD and lowercasing
_SHRINK = {"NFC": UNICODE_SHRINK, "NFD": UNICODE_SHRINK, "NFKC": UNICODE_SHRINK}
_SHRINK |= {"NFKD": UNICODE_SHRINK, "Lowercase": UNICODE_SHRINK, "Prepend": 1}
_SAFE_PRE = {"ByteLevel", "Metaspace", "Digits", "UnicodeScripts", "Punctuation", "Split"}


@attrs.frozen
class TokenBound:
    """At least `ceil(bytes / bytes_per_token)` tokens for any text of that many bytes."""

    bytes_per_token: int

    def tokens_at_least(self, text_bytes: int) -> int:
        return math.ceil(text_bytes / self.bytes_per_token)


def token_bound(tokenizer: Any) -> TokenBound | None:
    """The bound for a Hugging Face fast tokenizer (or mlx-lm's wrapper of one); None when
    its pipeline may drop or fold text, or cannot be read."""
    backend = tokenizer
    for _ in range(3):  # mlx-lm's wrapper -> transformers' fast tokenizer -> tokenizers'
        if hasattr(backend, "to_str"):
            break
        backend = getattr(backend, "backend_tokenizer", None) or getattr(
            backend, "_tokenizer", None
        )
    try:
        spec = json.loads(backend.to_str()) if backend is not None else None
    except (AttributeError, ValueError, TypeError):
        spec = None
    if not isinstance(spec, dict):
        return None
    shrink = _normalizer_shrink(spec.get("normalizer"))
    model = spec.get("model") or {}
    if shrink is None or not _keeps_text(spec.get("pre_tokenizer")) or not _no_fold(model):
        log.info("server.no_prompt_bound", model=model.get("type"))
        return None
    vocab = model.get("vocab") or {}
    pieces = list(vocab) if isinstance(vocab, dict) else [p[0] for p in vocab]  # Unigram: pairs
    one_byte_chars = "ByteLevel" in _types(spec.get("pre_tokenizer"))
    longest = max((len(p) if one_byte_chars else len(p.encode()) for p in pieces), default=0)
    added = [len(t.get("content", "").encode()) for t in spec.get("added_tokens") or []]
    longest = max([longest, *added])
    return TokenBound(shrink * longest) if longest else None


def _types(spec: Any) -> set[str]:
    """The `type`s of a pipeline step and of the steps in it."""
    if isinstance(spec, dict):
        return {str(spec.get("type")), *(t for v in spec.values() for t in _types(v))}
    if isinstance(spec, list):
        return {t for v in spec for t in _types(v)}
    return set()


def _normalizer_shrink(spec: Any) -> int | None:
    """How many times fewer bytes the normalizer can leave (None: unbounded)."""
    if spec is None:
        return 1
    kind = spec.get("type")
    if kind == "Sequence":
        total = 1
        for part in spec.get("normalizers") or []:
            step = _normalizer_shrink(part)
            if step is None:
                return None
            total *= step
        return total
    if kind == "Replace":
        pattern, content = spec.get("pattern") or {}, spec.get("content", "")
        literal = pattern.get("String")
        if not isinstance(literal, str) or not literal or not content:
            return None  # a regex, or a deletion: unbounded
        return max(1, math.ceil(len(literal.encode()) / len(content.encode())))
    return _SHRINK.get(str(kind))


def _keeps_text(spec: Any) -> bool:
    """Whether the pre-tokenizer passes every character on."""
    if spec is None:
        return True
    if spec.get("type") == "Sequence":
        return all(_keeps_text(p) for p in spec.get("pretokenizers") or [])
    return spec.get("type") in _SAFE_PRE and spec.get("behavior") != "Removed"


def _no_fold(model: dict[str, Any]) -> bool:
    """Whether the model never writes one token for text it does not know."""
    kind = model.get("type")
    if kind == "BPE":
        return not (model.get("unk_token") and model.get("fuse_unk"))
    if kind == "Unigram":
        return bool(model.get("byte_fallback"))
    return False
