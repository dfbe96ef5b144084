"""docs/benchmarks/scripts/edge0_gguf.py: a tiny Qwen3.5-MoE layout as a GGUF file that
llama.cpp runs like Edge0 resident (exactly at F32, within Q4_0's rounding at Q4_0)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("llama_cpp")

from docs_helpers import tiny_layout  # noqa: E402
from tool_helpers import load_tool  # noqa: E402

PROMPT = [5, 17, 99, 200, 42, 7, 311, 64]
STEPS = 6


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_layout(tmp_path_factory.mktemp("gguf"))


@pytest.fixture(scope="module")
def script() -> Any:
    return load_tool("docs/benchmarks/scripts/edge0_gguf.py")


def edge0_run(layout: Path) -> tuple[list[np.ndarray], list[int]]:
    """Edge0 resident: the prompt's logits at every position, then greedy tokens."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from edge0.layout.load import load_layout

    model = load_layout(layout, experts="resident").model
    cache = make_prompt_cache(model)
    logits = model(mx.array([PROMPT]), cache=cache)[0].astype(mx.float32)
    rows = [np.array(logits[i]) for i in range(len(PROMPT))]
    tokens = [int(np.argmax(rows[-1]))]
    for _ in range(STEPS - 1):
        step = model(mx.array([[tokens[-1]]]), cache=cache)[0, -1].astype(mx.float32)
        tokens.append(int(np.argmax(np.array(step))))
    return rows, tokens


def llama_run(gguf: Path) -> tuple[list[np.ndarray], list[int]]:
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=str(gguf), n_ctx=64, n_threads=1, logits_all=True, verbose=False
    )
    llm.eval(PROMPT)
    rows = [np.array(llm.scores[i]) for i in range(len(PROMPT))]
    tokens = [int(np.argmax(rows[-1]))]
    for _ in range(STEPS - 1):
        llm.eval([tokens[-1]])
        tokens.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
    assert llm.tokenize(b"hello world")  # the vocabulary loads and tokenizes
    return rows, tokens


def test_f32_export_runs_as_edge0_resident(layout: Path, script: Any, tmp_path: Path) -> None:
    out = tmp_path / "tiny-f32.gguf"
    script.write(layout, out, quantize=False)
    ours, our_tokens = edge0_run(layout)
    theirs, their_tokens = llama_run(out)
    assert their_tokens == our_tokens
    for a, b in zip(ours, theirs, strict=True):
        assert np.corrcoef(a, b)[0, 1] > 0.9999
        assert np.max(np.abs(a - b)) < 1e-2 * max(1.0, float(np.max(np.abs(a))))


def test_q4_0_export(layout: Path, script: Any, tmp_path: Path) -> None:
    import gguf

    out = tmp_path / "tiny-q4_0.gguf"
    script.write(layout, out)
    reader = gguf.GGUFReader(out)
    kinds = {t.name: t.tensor_type.name for t in reader.tensors}
    assert kinds["blk.0.ffn_gate_exps.weight"] == "Q4_0"
    assert kinds["blk.0.attn_qkv.weight"] == "Q4_0"
    assert kinds["output.weight"] == "Q4_0"
    for f32 in ("blk.0.ssm_a", "blk.0.ssm_conv1d.weight", "blk.0.ffn_gate_inp.weight"):
        assert kinds[f32] == "F32"
    fields = reader.fields
    assert bytes(fields["general.architecture"].parts[-1]).decode() == "qwen35moe"
    assert "qwen35moe.ssm.time_step_rank" in fields
    ours, our_tokens = edge0_run(layout)
    theirs, their_tokens = llama_run(out)
    # Q4_0's rounding on top of the layout's int4 moves a tiny random model's logits visibly
    corr = [float(np.corrcoef(a, b)[0, 1]) for a, b in zip(ours, theirs, strict=True)]
    assert min(corr) > 0.6 and float(np.mean(corr)) > 0.85, corr
    assert their_tokens[0] == our_tokens[0]
