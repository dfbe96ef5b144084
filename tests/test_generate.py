"""The resident generation loop: greedy determinism, cache correctness, sampling, limits, stats."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from edge0.errors import PromptError
from edge0.model.generate import Piece, SamplingSettings, encode_prompt, generate
from edge0.stats import GenerationStats

PROMPT = "def fibonacci(n):"


def run(
    loaded: Any, settings: SamplingSettings, prompt: str = PROMPT
) -> tuple[list[int], str, GenerationStats]:
    pieces: list[Piece] = list(
        generate(loaded, encode_prompt(loaded.tokenizer, prompt, chat=False), settings)
    )
    assert pieces[-1].stats is not None and all(p.stats is None for p in pieces[:-1])
    tokens = [p.token for p in pieces if p.token is not None]
    return tokens, "".join(p.text for p in pieces), pieces[-1].stats


def no_eos(loaded: Any) -> Any:
    # Random fixtures can emit the end token at any step; lengths are tested without it.
    return attrs.evolve(loaded, tokenizer=_NoEos(loaded.tokenizer))


class _NoEos:
    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.eos_token_ids: set[int] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.mark.parametrize("model_type", ["qwen3_moe", "qwen3_5_moe"])
def test_greedy_matches_uncached_argmax(
    model_type: str, loaded_model: Callable[[str], Any]
) -> None:
    loaded = no_eos(loaded_model(model_type))
    tokens, text, stats = run(loaded, SamplingSettings(max_tokens=12))
    # Recompute every step from scratch (no cache): the cached loop must agree exactly.
    seq = encode_prompt(loaded.tokenizer, PROMPT, chat=False)
    expected = []
    for _ in range(12):
        nxt = int(mx.argmax(loaded.model(mx.array(seq)[None])[0, -1]).item())
        expected.append(nxt)
        seq.append(nxt)
    assert tokens == expected
    assert stats.finish_reason == "length"
    assert stats.decode_tokens == 11 and stats.prompt_tokens == len(seq) - 12
    assert text == loaded.tokenizer.decode(expected)
    assert run(loaded, SamplingSettings(max_tokens=12))[0] == tokens  # deterministic


def test_stops_at_eos(loaded_model: Callable[[str], Any]) -> None:
    loaded = no_eos(loaded_model("qwen3_5_moe"))
    first = run(loaded, SamplingSettings(max_tokens=3))[0]
    loaded.tokenizer.eos_token_ids = {first[1]}
    tokens, _, stats = run(loaded, SamplingSettings(max_tokens=10))
    assert tokens == first[:1]
    assert stats.finish_reason == "stop"


def test_sampling_seed_and_top_k(loaded_model: Callable[[str], Any]) -> None:
    loaded = no_eos(loaded_model("qwen3_moe"))
    hot = SamplingSettings(max_tokens=16, temp=1.0, seed=3)
    a = run(loaded, hot)[0]
    assert run(loaded, hot)[0] == a
    assert run(loaded, attrs.evolve(hot, seed=4))[0] != a
    greedy = run(loaded, SamplingSettings(max_tokens=16))[0]
    assert run(loaded, attrs.evolve(hot, top_k=1))[0] == greedy
    assert run(loaded, attrs.evolve(hot, min_p=1.0))[0] == greedy
    assert run(loaded, attrs.evolve(hot, top_p=1e-6))[0] == greedy


def test_chat_template(loaded_model: Callable[[str], Any]) -> None:
    tok = loaded_model("qwen3_5_moe").tokenizer
    plain = encode_prompt(tok, "hello", chat=False)
    chat = encode_prompt(tok, "hello", chat=True)
    assert tok.decode(chat) == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    assert plain == tok.encode("hello")


def test_prompt_too_long(loaded_model: Callable[[str], Any]) -> None:
    loaded = loaded_model("qwen3_moe")
    with pytest.raises(PromptError, match=r"prompt is 256 tokens but .*config.json allows 256"):
        next(generate(loaded, [5] * 256))
    with pytest.raises(PromptError, match="empty"):
        next(generate(loaded, []))


def test_max_tokens_clamped_to_context(loaded_model: Callable[[str], Any]) -> None:
    loaded = no_eos(loaded_model("qwen3_moe"))
    pieces = list(generate(loaded, [5] * 250, SamplingSettings(max_tokens=100)))
    assert sum(p.token is not None for p in pieces) == 6  # 250 + 6 = 256 positions
    assert pieces[-1].stats is not None and pieces[-1].stats.decode_tokens == 5


def test_stats(loaded_model: Callable[[str], Any]) -> None:
    loaded = no_eos(loaded_model("qwen3_5_moe"))
    _, _, stats = run(loaded, SamplingSettings(max_tokens=8))
    assert stats.prompt_tps > 0 and stats.decode_tps > 0
    weights = sum(v.nbytes for _, v in tree_flatten(loaded.model.parameters()))
    assert stats.peak_mlx_bytes >= weights
    assert stats.peak_rss_bytes > stats.peak_mlx_bytes
    line = stats.line()
    assert "\n" not in line
    for part in ("prompt:", "tok/s", "decode: 7 tok", "peak MLX memory:", "peak RSS:", "MiB"):
        assert part in line


def test_text_stream_joins_to_decode(loaded_model: Callable[[str], Any]) -> None:
    from edge0.model.generate import TextStream

    tok = loaded_model("qwen3_moe").tokenizer
    text = " héllo wörld → ✓ def f(x):\n    return x"
    ids = tok.encode(text)
    stream = TextStream(tok)
    pieces = [stream.add(i) for i in ids]
    assert "".join(pieces) + stream.flush() == text
    assert all("\ufffd" not in p for p in pieces)


def test_no_chat_template_means_plain_prompt(model_copy: Callable[[str], Any]) -> None:
    import json

    from edge0.model.loader import load_tokenizer

    path = model_copy("qwen3_moe")
    config = json.loads((path / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = load_tokenizer(path)
    assert encode_prompt(tok, "hello", chat=True) == tok.encode("hello")
