"""A request's token hooks: a grammar's token mask (llguidance), the draws' log-probabilities.

`Decoding` is the `TokenHooks` of one request (edge0.model.generate): the sampler
calls `mask` before each draw and `drawn` after it, on the compute thread, in
every mode and in batched decode alike (the mask changes what a request draws,
not what the step reads). A grammar comes from `Grammars`, which holds the
llguidance tokenizer of the served model (built once, off the event loop) and
turns JSON schemas and tool definitions into grammars, refusing bad ones with a
RequestError.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import attrs
import llguidance
import llguidance.hf
import mlx.core as mx
import numpy as np
from mlx_lm.tokenizer_utils import TokenizerWrapper

from edge0.errors import RequestError

# Compact JSON, no free whitespace: a model cannot spin on blanks inside a structure.
STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT: dict[str, Any] = {"type": "object"}


@attrs.frozen
class TokenLogprob:
    """One drawn token: its id, its log-probability, and the most likely tokens (id, logprob)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class Decoding:
    """One request's hooks: `grammar` (an llguidance grammar) masks its draws; `top_logprobs`
    >= 0 records each draw's log-probability and that many alternatives into `records`;
    `param` is the request field the grammar enforces (named when the grammar fails)."""

    def __init__(
        self,
        grammars: Grammars | None = None,
        grammar: str | None = None,
        top_logprobs: int | None = None,
        param: str | None = None,
    ) -> None:
        self.param = param
        self.records: list[TokenLogprob] = []
        self.top_logprobs = top_logprobs
        self._matcher: Any = None
        if grammars is not None and grammar is not None:
            self._matcher = llguidance.LLMatcher(grammars.tokenizer, grammar, log_level=0)
            words = (grammars.tokenizer.vocab_size + 31) // 32
            self._bits = np.zeros(words, dtype=np.int32)
        self._last: mx.array | None = None  # the previous draw (evaluated by its step's fence)

    def mask(self, logprobs: mx.array) -> mx.array:
        if self._matcher is None:
            return logprobs
        m = self._matcher
        if self._last is not None:
            m.consume_token(int(self._last.item()))  # type: ignore[arg-type]
        if m.is_error():
            raise RequestError(
                f"constrained decoding failed: {short(m.get_error())}; simplify the schema",
                param=self.param,
            )
        m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        vocab = logprobs.shape[-1]
        allowed = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[:vocab]
        if allowed.size < vocab:  # ids past the tokenizer's vocabulary are never allowed
            allowed = np.pad(allowed, (0, vocab - allowed.size))
        masked = mx.where(mx.array(allowed.astype(bool)), logprobs, -mx.inf)
        return masked - mx.logsumexp(masked, axis=-1, keepdims=True)  # renormalised

    def drawn(self, logprobs: mx.array, token: mx.array) -> None:
        self._last = token
        k = self.top_logprobs
        if k is None:
            return
        row = logprobs[0]  # (vocab,)
        chosen = row[token[0]]
        top = mx.argpartition(-row, k - 1)[:k] if k > 0 else mx.zeros((0,), dtype=mx.uint32)
        values = row[top]
        mx.eval(token, chosen, top, values)  # the step's fence comes next: no extra compute
        ids: list[int] = top.tolist()  # type: ignore[assignment]
        lps: list[float] = values.tolist()  # type: ignore[assignment]
        pairs = sorted(zip(ids, lps, strict=True), key=lambda p: -p[1])
        self.records.append(
            TokenLogprob(
                int(token.item()),  # type: ignore[arg-type]
                float(chosen.item()),  # type: ignore[arg-type]
                tuple((int(i), float(v)) for i, v in pairs),
            )
        )


class Grammars:
    """Grammars for one tokenizer (the llguidance tokenizer is built on first use, ~1 s)."""

    def __init__(self, tokenizer: Any, vocab: int, eos: list[int]) -> None:
        wrapped = isinstance(tokenizer, TokenizerWrapper)  # mlx-lm's wrapper holds HF's
        self._hf = tokenizer._tokenizer if wrapped else tokenizer
        self._vocab = vocab
        self._eos = eos
        self._lock = threading.Lock()
        self._tokenizer: Any = None

    @property
    def tokenizer(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = llguidance.hf.from_tokenizer(
                    self._hf, n_vocab=self._vocab, eos_token=self._eos or None
                )
            return self._tokenizer

    def check(self, grammar: str, param: str, what: str = "its schema") -> str:
        """`grammar` when llguidance takes it and it admits some text; else a RequestError
        naming `param`. A schema that only refers to itself ({"$ref": "#"}, a `$defs` loop)
        compiles to a grammar with no text in it: refused, never answered with ""."""
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            grammar, self.tokenizer
        )
        if is_error:
            raise RequestError(f"`{param}` cannot be enforced: {short(messages)}", param=param)
        if not self._writes_text(grammar):
            raise RequestError(
                f"`{param}` cannot be enforced: {what} admits no JSON value (a schema that "
                'only refers to itself, such as {"$ref": "#"} or a `$defs` loop, has none); '
                "give the recursion a way out",
                param=param,
            )
        return grammar

    def _writes_text(self, grammar: str) -> bool:
        """Whether a matcher of `grammar` lets a first token other than end of sequence
        through (its errors show once the first mask is computed)."""
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        bits = np.zeros((self.tokenizer.vocab_size + 31) // 32, dtype=np.int32)
        matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        if matcher.is_error() or matcher.is_stopped():
            return False
        allowed = np.unpackbits(bits.view(np.uint8), bitorder="little")
        allowed[[e for e in self._eos if e < allowed.size]] = 0
        return bool(allowed.any())

    @staticmethod
    def json_grammar(schema: dict[str, Any]) -> str:
        """A grammar for JSON text that validates against `schema` (unchecked: see `check`)."""
        return str(llguidance.LLMatcher.grammar_from_json_schema({**schema, "x-guidance": STYLE}))

    @staticmethod
    def tool_grammar(tools: list[tuple[str, dict[str, Any]]], start: str, end: str) -> str:
        """A grammar for one call of one of `tools` ((name, parameters schema)), written as
        `start` {"name": ..., "arguments": {...}} `end` (the json_tools format).

        Each tool's schema is a rule of its own (`%json`), so its `$ref`s (`#/$defs/...`,
        pydantic's shape) resolve against that schema, as the client wrote them."""
        lines = [f"start: {json.dumps(start + chr(10))} call {json.dumps(chr(10) + end)}"]
        lines.append("call: " + " | ".join(f"call_{i}" for i in range(len(tools))))
        for i, (name, params) in enumerate(tools):
            head = json.dumps(f'{{"name": {json.dumps(name)}, "arguments": ')
            schema = {**(params or ANY_OBJECT), "x-guidance": STYLE}
            lines.append(f'call_{i}: {head} args_{i} "}}"')
            lines.append(f"args_{i}: %json {json.dumps(schema)}")
        return str(llguidance.LLMatcher.grammar_from_lark("\n".join(lines) + "\n"))


_SOURCE_LINE = re.compile(r"^\s*(\d+ \||\^+\s*$)")  # the grammar's text quoted back, a caret
_AT = re.compile(r"^at \d+\(\d+\): ")  # a position in our own grammar text


def short(messages: list[str] | str, limit: int = 200) -> str:
    """The grammar library's message in one short line: no quoted grammar text, no parser
    state, at most `limit` characters."""
    text = messages if isinstance(messages, str) else "; ".join(messages)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not _SOURCE_LINE.match(ln)]
    line = _AT.sub("", " ".join(lines[:4]))
    if "<state>" in line:
        line = line[: line.index("<state>")].strip()
    return line if len(line) <= limit else line[: limit - 3] + "..."
