"""Qwen3-MoE attention's one-token layout (edge0.kernels.layers.OneTokenQwen3MoeAttention): the
logits of mlx-lm's own attention, bit for bit, one token and a batch of rows at a time."""

from __future__ import annotations

import io
import re
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.models import qwen3_moe
from mlx_lm.models.cache import make_prompt_cache
from runtime_helpers import PROMPT, build_store

import edge0.model.loader
from edge0.kernels.layers import OneTokenQwen3MoeAttention


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("one-token-attn"), "qwen3_moe", layers=4)


def _attentions(model: object) -> list[object]:
    return [m for _, m in model.named_modules() if isinstance(m, qwen3_moe.Attention)]  # type: ignore[attr-defined]


def _decode_logits(model: object, rows: list[list[int]]) -> list[mx.array]:
    """The prompt's first token, then one token a step: every step's logits (B, vocab)."""
    cache = make_prompt_cache(model)  # type: ignore[arg-type]
    out = []
    for t in range(len(rows[0])):
        ids = mx.array([[r[t]] for r in rows])
        logits = model(ids, cache=cache)[:, -1, :]  # type: ignore[operator]
        mx.eval(logits)
        out.append(logits)
    return out


@pytest.mark.parametrize("batch", [1, 2])
def test_one_token_steps_give_mlx_lms_logits_bit_for_bit(store: Path, batch: int) -> None:
    model = edge0.model.loader.load(store).model
    attns = _attentions(model)
    assert attns and all(type(a) is OneTokenQwen3MoeAttention for a in attns)
    rows = [PROMPT, PROMPT[::-1]][:batch]
    got = _decode_logits(model, rows)
    for a in attns:
        a.__class__ = qwen3_moe.Attention
    want = _decode_logits(model, rows)
    for g, w in zip(got, want, strict=True):
        assert mx.array_equal(g, w).item()  # the same bits


def test_a_prompt_chunk_takes_mlx_lms_path(store: Path) -> None:
    model = edge0.model.loader.load(store).model
    cache = make_prompt_cache(model)
    got = model(mx.array([PROMPT]), cache=cache)
    for a in _attentions(model):
        a.__class__ = qwen3_moe.Attention
    want = model(mx.array([PROMPT]), cache=make_prompt_cache(model))
    assert mx.array_equal(got, want).item()


def test_a_one_token_layer_builds_fewer_nodes(store: Path) -> None:
    model = edge0.model.loader.load(store).model
    attn = _attentions(model)[0]
    x = mx.random.normal((1, 1, model.args.hidden_size))
    mx.eval(x)

    def nodes() -> int:
        cache = make_prompt_cache(model)[0]
        buf = io.StringIO()
        mx.export_to_dot(buf, attn(x, None, cache))
        return len(re.findall(r'label ="', buf.getvalue()))

    lean = nodes()
    attn.__class__ = qwen3_moe.Attention
    assert nodes() - lean == 4


# --- a decode step's embedding rows, dequantized on the host --------------------------------


@pytest.mark.parametrize(("bits", "group"), [(4, 32), (4, 64), (4, 128), (8, 64)])
def test_host_rows_are_mlxs_dequantize_bit_for_bit(bits: int, group: int) -> None:
    from mlx.nn import QuantizedEmbedding

    from edge0.kernels.layers import HOST_ROWS, NativeQuantizedEmbedding, host_rows

    emb = QuantizedEmbedding(300, 256, group_size=group, bits=bits)
    emb.__class__ = NativeQuantizedEmbedding
    for ids in ([[0]], [[299]], [[7], [123]], [list(range(HOST_ROWS))]):
        x = mx.array(ids)
        got = host_rows(emb, x)
        assert got is not None
        want = QuantizedEmbedding.__call__(emb, x)
        assert got.shape == want.shape and got.dtype == want.dtype
        assert mx.array_equal(got, want).item()
    every = mx.arange(300).reshape(-1, 1)
    for i in range(0, 300, HOST_ROWS):
        rows = every[i : i + HOST_ROWS]
        assert mx.array_equal(emb(rows), QuantizedEmbedding.__call__(emb, rows)).item()
    assert host_rows(emb, mx.zeros((1, HOST_ROWS + 1), dtype=mx.int32)) is None  # a prompt


def test_the_models_embedding_gives_the_same_logits(store: Path) -> None:
    model = edge0.model.loader.load(store).model
    emb = model.model.embed_tokens
    from edge0.kernels.layers import host_rows

    assert host_rows(emb, mx.array([[PROMPT[0]]])) is not None  # the decode steps take it
    got = _decode_logits(model, [PROMPT])
    emb.__class__ = __import__("mlx.nn", fromlist=["QuantizedEmbedding"]).QuantizedEmbedding
    want = _decode_logits(model, [PROMPT])
    for g, w in zip(got, want, strict=True):
        assert mx.array_equal(g, w).item()
