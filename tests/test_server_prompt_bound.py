"""The prompt's least token count from its bytes (edge0.server.prompt_bound) never exceeds the real
count, on the demo tokenizer and on pipelines that shrink text (NFKC, lowercasing, byte-level);
pipelines that can drop or fold text get no bound; a prompt that cannot fit is refused before
the tokenizer sees it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from edge0.errors import RequestError
from edge0.server.backend import Backend
from edge0.server.metrics import ServerMetrics
from edge0.server.prompt_bound import token_bound
from edge0.server.schemas import Sampling, TextRequest

# text that normalization shrinks: the Kelvin sign, fullwidth and mathematical letters, Hangul
# jamo that compose to one syllable, combining marks, ligatures; and long runs of one byte
SHRINKING = ["\u212a", "\uff21", "\U0001d400", "\u1100\u1161\u11a8", "e\u0301", "\ufb00", "  "]
TEXT = st.lists(
    st.one_of(st.sampled_from(SHRINKING), st.text(max_size=8), st.just(" " * 200)), max_size=40
).map("".join)
CORPUS = ["def parse(s):\n    return s.split()\n", "The Kelvin sign K and Hangul 각", "x = 1"] * 20


def _trained(normalizer: Any, pre: Any, model: Any, trainer: Any) -> Tokenizer:
    tok = Tokenizer(model)
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def _bpe(normalizer: Any, pre: Any) -> Tokenizer:
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    return _trained(normalizer, pre, models.BPE(), trainer)


SHRINK_PIPELINES = {
    "nfkc-lower-bytelevel": lambda: _bpe(
        normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()]),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ),
    "nfc-bytelevel": lambda: _bpe(normalizers.NFC(), pre_tokenizers.ByteLevel()),
}


@pytest.fixture(scope="module")
def demo_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from edge0.model.demo import teacher_path

    return AutoTokenizer.from_pretrained(str(teacher_path()))


@settings(max_examples=150, deadline=None)
@given(text=TEXT)
def test_the_bound_never_exceeds_the_count_on_the_demo_tokenizer(
    demo_tokenizer: Any, text: str
) -> None:
    bound = token_bound(demo_tokenizer)
    assert bound is not None
    count = len(demo_tokenizer.encode(text, add_special_tokens=False))
    assert bound.tokens_at_least(len(text.encode())) <= count


@pytest.mark.parametrize("name", sorted(SHRINK_PIPELINES))
def test_the_bound_holds_where_normalization_shrinks_text(name: str) -> None:
    tok = SHRINK_PIPELINES[name]()
    bound = token_bound(tok)
    assert bound is not None

    @settings(max_examples=150, deadline=None)
    @given(text=TEXT)
    def check(text: str) -> None:
        assert bound.tokens_at_least(len(text.encode())) <= len(tok.encode(text).ids)

    check()
    # the worst case: the longest lowercase word of the vocabulary, written in mathematical
    # bold letters (4 bytes each) that NFKC turns back into it: one token per 4x its bytes
    word = max((w for w in tok.get_vocab() if w.isascii() and w.isalpha() and w.islower()), key=len)
    bold = "".join(chr(0x1D41A + ord(c) - ord("a")) for c in word)
    worst = " ".join([bold] * 200)
    assert bound.tokens_at_least(len(worst.encode())) <= len(tok.encode(worst).ids)


@pytest.mark.parametrize(
    "build",
    [
        lambda: _bpe(normalizers.Strip(), pre_tokenizers.ByteLevel()),  # strips text
        lambda: _bpe(None, pre_tokenizers.Whitespace()),  # drops whitespace
        lambda: _trained(
            None,
            pre_tokenizers.Whitespace(),
            models.WordPiece(unk_token="[UNK]"),  # an unknown word of any length: one token
            trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[UNK]"]),
        ),
        lambda: _bpe(normalizers.Replace(" ", ""), pre_tokenizers.ByteLevel()),  # deletes
    ],
)
def test_pipelines_that_drop_or_fold_text_have_no_bound(build: Any) -> None:
    assert token_bound(build()) is None


class _NoEncode:
    """A tokenizer that fails the test if the server tokenizes with it."""

    has_chat_template = False
    eos_token_ids: list[int] = []

    def __init__(self, real: Any) -> None:
        self.backend_tokenizer = real.backend_tokenizer

    def encode(self, *args: Any, **kw: Any) -> Any:
        raise AssertionError("the prompt was tokenized")


def test_a_prompt_that_cannot_fit_is_refused_without_tokenizing(demo_tokenizer: Any) -> None:
    tok = _NoEncode(demo_tokenizer)
    config = {"max_position_embeddings": 512, "vocab_size": 8192}
    engine = SimpleNamespace(
        tokenizer=tok,
        options=SimpleNamespace(max_batch=1, hosts=None),
        setup=SimpleNamespace(manifest=SimpleNamespace(config=config)),
    )
    backend = Backend(engine, "m", ServerMetrics(), bound=token_bound(tok))  # type: ignore[arg-type]
    request = TextRequest(model="m", sampling=Sampling(), prompt="x" * (1 << 20))
    with pytest.raises(RequestError) as err:
        asyncio.run(backend.start("openai.completions", request))
    assert err.value.code == "context_length_exceeded" and err.value.param == "prompt"
    assert "at least 15888 tokens" in str(err.value)  # 1 MiB over 66 bytes a token
