"""`edge0 run` through click's CliRunner: streaming text, the stats line, bad input -> exit 2."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from edge0.cli.main import main
from edge0.errors import ModelLoadError, PromptError
from edge0.model.demo import default_model_path
from edge0.model.generate import SamplingSettings, encode_prompt, generate
from edge0.routing.validation import Validation

STATS = re.compile(
    r"^prompt: \d+ tok, [\d.]+ tok/s \| decode: \d+ tok, [\d.]+ tok/s \| "
    r"peak MLX memory: [\d.]+ MiB \| peak RSS: [\d.]+ MiB$"
)
# a streamed run's one line: the same, then reads, waits, and whether the output is exact
STREAM_STATS = re.compile(
    STATS.pattern[:-1] + r" \| reads: [\d.]+ MiB/token \| blocked: [\d.]+ ms/step"
    r" \| (exact|approximate \(route, .+\))$"
)


def edge0(*args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=stdin)


def expected_text(loaded: Any, prompt: str, chat: bool, **settings: Any) -> str:
    tokens = encode_prompt(loaded.tokenizer, prompt, chat=chat)
    return "".join(p.text for p in generate(loaded, tokens, SamplingSettings(**settings)))


@pytest.mark.parametrize("model_type", ["qwen3_moe", "qwen3_5_moe"])
def test_run_prints_text_then_stats(model_type: str, loaded_model: Callable[[str], Any]) -> None:
    path = Path(__file__).parent / "fixtures" / model_type
    result = edge0("run", str(path), "-p", "def fibonacci(n):", "--max-tokens", "10", "--no-chat")
    assert result.exit_code == 0, result.output
    text = expected_text(loaded_model(model_type), "def fibonacci(n):", False, max_tokens=10)
    assert result.stdout.rstrip("\n") == text.rstrip("\n")
    assert STATS.match(result.stderr.strip()), result.stderr


def test_chat_and_sampling_options(
    qwen3_5_moe_path: Path, loaded_model: Callable[[str], Any]
) -> None:
    args = ["run", str(qwen3_5_moe_path), "-p", "hello", "--max-tokens", "12"]
    opts = [
        "--temp",
        "0.9",
        "--top-p",
        "0.95",
        "--sample-top-k",
        "50",
        "--min-p",
        "0.01",
        "--seed",
        "7",
    ]
    first, second = edge0(*args, *opts), edge0(*args, *opts)
    assert first.exit_code == 0, first.output
    assert first.stdout == second.stdout  # seeded
    text = expected_text(
        loaded_model("qwen3_5_moe"),
        "hello",
        True,
        max_tokens=12,
        temp=0.9,
        top_p=0.95,
        top_k=50,
        min_p=0.01,
        seed=7,
    )
    assert first.stdout.rstrip("\n") == text.rstrip("\n")


def test_prompt_from_stdin(qwen3_moe_path: Path) -> None:
    a = edge0("run", str(qwen3_moe_path), "-p", "-", "--max-tokens", "6", stdin="Hello world\n")
    b = edge0("run", str(qwen3_moe_path), "-p", "Hello world\n", "--max-tokens", "6")
    assert a.exit_code == 0 and a.stdout == b.stdout


def test_default_model_is_converted_on_first_use() -> None:
    result = edge0("run", "-p", "def fibonacci(n):", "--max-tokens", "5")
    assert result.exit_code == 0, result.output
    # The demo student streams its experts: one stats line by default ...
    assert STREAM_STATS.match(result.stderr.strip()), result.stderr
    # ... and with -v (or --stats full) the runtime summary, opened by the speed line
    full = edge0("run", "-p", "def fibonacci(n):", "--max-tokens", "5", "-v")
    assert full.exit_code == 0, full.output
    lines = full.stderr.strip().splitlines()
    assert STATS.match(lines[0]) and len(lines) > 1, full.stderr
    # the default mode: route where the shipped heads carry a validation record, else hint
    validated = Validation.read(default_model_path()) is not None
    mode = "mode route, approximate (route, agreement " if validated else "mode hint, exact"
    assert any(line.startswith(mode) for line in lines), full.stderr
    assert any(line.startswith("tickets issued") for line in lines), full.stderr
    assert full.stdout == result.stdout  # greedy: the same text whatever is reported


def test_prompt_is_required(qwen3_moe_path: Path) -> None:
    result = edge0("run", str(qwen3_moe_path))
    assert result.exit_code == 2 and "Missing option '-p'" in result.stderr


# Bad input: exit code 2, one line "edge0: error: ..." naming the file and the fix.


def _assert_one_line_error(result: Result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edge0: error: "), result.stderr
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0]


def _with_model_type(copy: Path, model_type: str) -> Path:
    config = json.loads((copy / "config.json").read_text())
    config["model_type"] = model_type
    (copy / "config.json").write_text(json.dumps(config))
    return copy


def test_missing_path(tmp_path: Path) -> None:
    result = edge0("run", str(tmp_path / "missing"), "-p", "hi")
    _assert_one_line_error(result, str(tmp_path / "missing"), "check the path")


def test_unknown_model_type(model_copy: Callable[[str], Path]) -> None:
    path = _with_model_type(model_copy("qwen3_moe"), "frobnicator")
    result = edge0("run", str(path), "-p", "hi")
    msg = "'frobnicator' is a Mixture-of-Experts family Edge0 does not support yet"
    _assert_one_line_error(result, str(path / "config.json"), msg)


def test_non_moe_model_type(model_copy: Callable[[str], Path]) -> None:
    path = _with_model_type(model_copy("qwen3_moe"), "qwen3")
    result = edge0("run", str(path), "-p", "hi")
    msg = "is a dense model: it has no experts to stream"
    _assert_one_line_error(result, str(path / "config.json"), msg)


def test_truncated_safetensors(model_copy: Callable[[str], Path]) -> None:
    path = model_copy("qwen3_moe")
    shard = path / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-4096])
    result = edge0("run", str(path), "-p", "hi")
    _assert_one_line_error(result, str(shard), "truncated", "re-download or re-convert")


def test_prompt_longer_than_context(qwen3_moe_path: Path) -> None:
    result = edge0("run", str(qwen3_moe_path), "-p", "hello " * 300)
    _assert_one_line_error(result, str(qwen3_moe_path / "config.json"), "shorten the prompt")


def test_debug_shows_the_exception(tmp_path: Path, qwen3_moe_path: Path) -> None:
    result = edge0("--debug", "run", str(tmp_path / "missing"), "-p", "hi")
    assert isinstance(result.exception, ModelLoadError)
    result = edge0("--debug", "run", str(qwen3_moe_path), "-p", "hello " * 300)
    assert isinstance(result.exception, PromptError)
