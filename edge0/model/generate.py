"""Resident generation loop: prefill, then one decode step per token with mlx-lm samplers."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from edge0.errors import PromptError
from edge0.log import get_logger
from edge0.model.loader import LoadedModel
from edge0.options.sampling import SamplingSettings as SamplingSettings  # re-exported
from edge0.options.sampling import TokenHooks as TokenHooks  # re-exported
from edge0.stats import GenerationStats, peak_mlx_bytes, peak_rss_bytes

log = get_logger(__name__)

PREFILL_CHUNK = 512  # prompt tokens per forward pass during prefill


class Sampler:
    """Logits -> one token: log-probabilities, mlx-lm's filters, then a draw (argmax at temp 0).

    A seeded sampler splits its own key once per token, so its draws do not depend on
    anything else that uses MLX's global random state.
    """

    def __init__(self, settings: SamplingSettings) -> None:
        self.temp = settings.temp
        self._filters: list[Callable[[mx.array], mx.array]] = []
        if 0.0 < settings.top_p < 1.0:
            self._filters.append(functools.partial(apply_top_p, top_p=settings.top_p))
        if settings.min_p > 0.0:
            self._filters.append(functools.partial(apply_min_p, min_p=settings.min_p))
        self.top_k = settings.top_k
        self._key = None if settings.seed is None else mx.random.key(settings.seed)
        self.hooks = settings.hooks

    def __call__(self, logits: mx.array) -> mx.array:
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)  # (1, vocab)
        if self.hooks is None:
            return self._draw(logprobs)
        token = self._draw(self.hooks.mask(logprobs))
        self.hooks.drawn(logprobs, token)
        return token

    def _draw(self, logprobs: mx.array) -> mx.array:
        if self.temp == 0:
            return mx.argmax(logprobs, axis=-1)
        for keep in self._filters:
            logprobs = keep(logprobs)
        if 0 < self.top_k < logprobs.shape[-1]:  # top_k >= vocab keeps every token
            logprobs = apply_top_k(logprobs, self.top_k)
        key = None
        if self._key is not None:
            self._key, key = mx.random.split(self._key)
        return mx.random.categorical(logprobs * (1.0 / self.temp), key=key)


@attrs.frozen
class Piece:
    """One generated token and the text it completes ("" while a character is partial).

    The last piece of a generation has token None, the remaining text, and the stats.
    """

    text: str
    token: int | None = None
    stats: GenerationStats | None = None


class TextStream:
    """Incremental detokenizer: the pieces always join to `tokenizer.decode(tokens)`.

    Decodes a short window of recent tokens and emits the new text once it does not end
    in a partial UTF-8 character (mlx-lm's streaming detokenizers drop a leading space,
    which would corrupt plain continuations).
    """

    MAX_PENDING = 16  # emit even a broken character after this many tokens

    def __init__(self, tokenizer: Any) -> None:
        self._decode = tokenizer.decode
        self._ids: list[int] = []
        self._start = 0  # window start (context for the decoder)
        self._done = 0  # tokens whose text was emitted

    def add(self, token: int) -> str:
        self._ids.append(token)
        new = self._decode(self._ids[self._start :])
        if new.endswith("\ufffd") and len(self._ids) - self._done < self.MAX_PENDING:
            return ""
        return self._emit(new)

    def flush(self) -> str:
        return self._emit(self._decode(self._ids[self._start :]))

    def _emit(self, new: str) -> str:
        old = self._decode(self._ids[self._start : self._done])
        # The next window starts at the tokens emitted now, unless they decode to nothing:
        # a window opening on such a token would lose the space before the next word.
        if self._decode(self._ids[self._done :]):
            self._start = self._done
        self._done = len(self._ids)
        return new[len(old) :]


def encode_prompt(tokenizer: Any, prompt: str, chat: bool = True) -> list[int]:
    """Token ids for a prompt; wrapped in the chat template when `chat` and there is one."""
    if chat and getattr(tokenizer, "has_chat_template", False):
        messages = [{"role": "user", "content": prompt}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return [int(i) for i in ids]
    return [int(i) for i in tokenizer.encode(prompt)]


def check_prompt(n_tokens: int, loaded: LoadedModel) -> None:
    """Raise PromptError for an empty prompt or one that does not fit the context."""
    if n_tokens == 0:
        raise PromptError("the prompt is empty; pass some text with -p")
    if n_tokens >= loaded.context_length:
        config_file = "edge0.json" if loaded.source_format == "edge0" else "config.json"
        raise PromptError(
            f"the prompt is {n_tokens} tokens but {loaded.path / config_file} allows "
            f"{loaded.context_length} (max_position_embeddings); shorten the prompt"
        )


def generate(
    loaded: LoadedModel,
    prompt_tokens: list[int],
    settings: SamplingSettings | None = None,
    cache: list[Any] | None = None,
) -> Iterator[Piece]:
    """Generate text for `prompt_tokens`, yielding pieces as soon as they decode.

    Args:
        loaded: the model (any mlx-lm model: `model(tokens, cache=...)` -> logits).
        prompt_tokens: the prompt ids (see `encode_prompt`).
        settings: sampling settings; greedy, 256 tokens by default.
        cache: a prompt cache from `make_prompt_cache`; a fresh one by default.

    Yields:
        One `Piece` per generated token (an end-of-sequence token is not yielded), then
        a final piece with `token=None` and `stats` set.

    Raises:
        PromptError: the prompt is empty or longer than the model's context.
    """
    settings = settings or SamplingSettings()
    check_prompt(len(prompt_tokens), loaded)
    max_tokens = min(settings.max_tokens, loaded.context_length - len(prompt_tokens))
    if max_tokens < settings.max_tokens:
        log.warning(
            "generate.max_tokens_clamped",
            requested=settings.max_tokens,
            allowed=max_tokens,
            context=loaded.context_length,
        )
    sampler = Sampler(settings)
    model, tokenizer = loaded.model, loaded.tokenizer
    cache = cache if cache is not None else make_prompt_cache(model)
    eos = set(tokenizer.eos_token_ids)
    detok = TextStream(tokenizer)
    stats = GenerationStats(prompt_tokens=len(prompt_tokens))
    mx.reset_peak_memory()

    def step(tokens: mx.array) -> mx.array:
        logits = model(tokens[None], cache=cache)[:, -1, :]  # (1, vocab)
        return sampler(logits)  # (1,)

    # 1. Prefill in chunks; the first token comes from the last chunk.
    start = time.perf_counter()
    prompt = mx.array(prompt_tokens, dtype=mx.uint32)
    for i in range(0, len(prompt_tokens) - 1, PREFILL_CHUNK):
        chunk = prompt[i : min(i + PREFILL_CHUNK, len(prompt_tokens) - 1)]
        model(chunk[None], cache=cache)
        mx.eval([c.state for c in cache])
    y = step(prompt[-1:] if len(prompt_tokens) > 1 else prompt)
    mx.eval(y)
    stats.prompt_seconds = time.perf_counter() - start

    # 2. Decode: queue step n+1 before detokenizing token n.
    start = time.perf_counter()
    n = 0
    finish = "length"
    while n < max_tokens:
        token = int(y.item())  # type: ignore[arg-type]
        n += 1
        if token in eos:
            finish = "stop"
            break
        nxt = None
        if n < max_tokens:
            nxt = step(y)
            mx.async_eval(nxt)
        yield Piece(text=detok.add(token), token=token)  # text "" mid-character
        if nxt is None:
            break
        y = nxt
    stats.decode_seconds = time.perf_counter() - start
    stats.decode_tokens = max(n - 1, 0)  # tokens that came out of decode steps
    stats.peak_mlx_bytes = peak_mlx_bytes()
    stats.peak_rss_bytes = peak_rss_bytes()
    stats.finish_reason = finish
    yield Piece(text=detok.flush(), token=None, stats=stats)
