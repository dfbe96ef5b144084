"""Hostile CLI input: one `edge0: error:` line, exit 2; streamer spaces; narrow experts convert."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from runtime_helpers import PROMPT, MockTier

from edge0.cli.main import main
from edge0.errors import ConversionError
from edge0.layout.convert import ConvertOptions, ExpertShape, _expert_params, convert
from edge0.layout.load import load_layout
from edge0.layout.manifest import Manifest
from edge0.layout.verify import verify
from edge0.model.generate import SamplingSettings, TextStream, generate
from edge0.runtime.engine.api import Engine
from edge0.synth.tiny import TinySpec, write_checkpoint


@pytest.fixture(scope="module")
def store(runtime_stores: dict[str, Path]) -> Path:
    return runtime_stores["qwen3_moe"]  # the session's read-only store (conftest.py)


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(TinySpec(model_type="qwen3_moe"), tmp_path_factory.mktemp("h") / "hf")


def one_line_error(res: Result, *needles: str) -> None:
    out = res.output
    assert res.exit_code == 2, out
    assert out.startswith("edge0: error: ") and out.count("\n") == 1, out
    assert "Traceback" not in out
    for needle in needles:
        assert needle in out, out


def edge0(*args: str, stdin: bytes | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=stdin)


def test_invalid_utf8_on_stdin(store: Path) -> None:
    res = edge0("run", str(store), "-p", "-", stdin=b"caf\xe9 \xff\xfe")
    one_line_error(res, "UTF-8", "byte 3")


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--memory-budget", "1e400"], "too large"),
        (["--tiers", "ram:1e400>pread"], "too large"),
        (["--temp", "nan"], "temp"),
        (["--temp", "inf"], "temp"),
        (["--top-p", "nan"], "top_p"),
        (["--trace", "/nonexistent-dir-e0/t.json"], "does not exist"),
        (["--log-json", "/nonexistent-dir-e0/l.jsonl"], "does not exist"),
        (["--mode", "resident", "--tiers", "pread"], "--tiers"),
        (["--mode", "resident", "--memory-budget", "3GiB", "--top-k", "2"], "--memory-budget"),
    ],
)
def test_run_flags(store: Path, flags: list[str], needle: str) -> None:
    one_line_error(edge0("run", str(store), "-p", "hi", "--max-tokens", "2", *flags), needle)


def test_output_files_are_checked_before_any_work(store: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no" / "log.jsonl"
    one_line_error(
        edge0("--log-json", str(missing), "run", str(tmp_path / "nope"), "-p", "x"),
        "--log-json",
        "does not exist",
    )
    res = edge0("run", str(store), "-p", "hi", "--max-tokens", "2", "--mode", "resident")
    assert res.exit_code == 0, res.output  # --mode resident alone is fine


def test_streaming_flags_on_a_non_layout_dir_are_refused(hf: Path) -> None:
    one_line_error(edge0("run", str(hf), "-p", "hi", "--io-workers", "3"), "--io-workers")


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--bits", "0"], "--bits 0"),
        (["--bits", "7"], "--bits 7"),
        (["--group-size", "0"], "--group-size 0"),
        (["--group-size", "48"], "--group-size 48"),
        (["--zstd-level", "99", "--compress", "zstd"], "--zstd-level"),
    ],
)
def test_convert_refuses_unsupported_quantization(
    hf: Path, tmp_path: Path, flags: list[str], needle: str
) -> None:
    one_line_error(edge0("convert", str(hf), str(tmp_path / "out"), *flags), needle)
    assert not (tmp_path / "out").exists()


def test_expert_widths_below_the_group_size_use_a_smaller_group(hf: Path, tmp_path: Path) -> None:
    # the tiny experts are 32 wide; the default group of 64 used to be refused
    res = edge0("convert", str(hf), str(tmp_path / "e0"))
    assert res.exit_code == 0, res.output
    m = Manifest.load(tmp_path / "e0")
    assert m.quantization["group_size"] == 32 and m.config["quantization"]["group_size"] == 64
    verify(tmp_path / "e0", progress=False)
    loaded = load_layout(tmp_path / "e0")
    ref = [p.token for p in generate(loaded, PROMPT, SamplingSettings(max_tokens=6)) if p.token]

    async def streamed() -> list[int]:
        path = tmp_path / "e0"
        async with Engine.open(path, mode="reactive", tiers=MockTier(path)) as eng:
            return [t async for t in eng.tokens(PROMPT, max_tokens=6)]

    assert asyncio.run(streamed()) == ref

    class Src:
        quantized, path, packed = False, hf, None

    with pytest.raises(ConversionError, match="not a multiple"):  # no supported group fits 48
        _expert_params(Src(), ExpertShape((0,), 4, 48, 48), {"group_size": 64, "bits": 4})  # type: ignore[arg-type]
    convert(hf, tmp_path / "g32", ConvertOptions(group_size=32))  # an explicit group that fits


def test_streamer_keeps_the_space_after_a_token_that_decodes_to_nothing() -> None:
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    # a sentencepiece-style decoder (fuse, then strip one leading space) and an empty token
    vocab = {"<unk>": 0, "a": 1, "\u2581b": 2, "": 3}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=tk)
    ids = [1, 3, 2, 3, 3, 2, 1]
    stream = TextStream(tok)
    text = "".join(stream.add(i) for i in ids) + stream.flush()
    assert text == tok.decode(ids) == "a b ba"
