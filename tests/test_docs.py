"""README.md and docs/ run as written: their shell commands and Python blocks, executed or checked.

What is collected (tests/doc_blocks.py): every fenced block of README.md and
docs/**/*.md tagged sh/bash/shell/console or python, and every untagged block
whose first line starts like a command (`edge0`, `make`, `python`, `.venv/bin/...`,
`export`, `VAR=...`). One test per command (continuation lines joined) and per
Python block; the commands of a block share one scratch directory and run in
order (a later command first runs the earlier ones).

Running: `bash -euo pipefail -c COMMAND` in the repository root, this
interpreter's bin directory first on PATH (so `edge0` is this venv's). The
placeholders of the docs are replaced, as whole words, by real paths:

    SRC         edge0/data/teacher (the shipped demo teacher, a Hugging Face checkpoint)
    OUT         SCRATCH/OUT; when no command of the block converts into it, a link to MODEL
    MODEL       the shipped demo model converted to the edge0 layout (the session's EDGE0_CACHE)
    prompt.txt  SCRATCH/prompt.txt, holding one line of Python
    trace.json  SCRATCH/trace.json
    make X      make X BIN=<this bin dir> -o <this bin dir>/edge0 (use the installed edge0)

Besides the exit code (0, no traceback) a command is held to what the docs
say about it: `edge0 run` prints its statistics to stderr, `--trace F` writes a
Chrome trace, `edge0 verify` says ok, `edge0 convert ... OUT` writes OUT.

Too slow for CI: put `<!-- ci: skip (REASON) -->` on the line(s) right above
the block (whole block) or ``<!-- ci: skip `CMD PREFIX` (REASON) -->`` (the
commands starting with CMD PREFIX); the test is reported as skipped with
REASON. `<!-- ci: synth PATH SHAPE -->` runs the block with PATH replaced by a
small checkpoint from `tools/synth_checkpoint.py --shape SHAPE` (edge0 layout):
for reruns documented on large scratch models. Pages under docs/benchmarks/ are
written by `edge0 bench` and skipped as a whole. Skipped or not, every
documented `edge0 ...` command (blocks and `inline spans`) must name real
subcommands and options, every `python tools/x.py --opt` a real script and
option, and every Python block must compile and its imports resolve. What runs
and what is skipped: docs/docs-tests.md.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from doc_blocks import (
    Block,
    Command,
    blocks,
    commands,
    doc_files,
    inline_commands,
    skip_rules,
    synth_paths,
)
from docs_helpers import BIN, ROOT, report, subprocess_env

TIMEOUT = 300
ALL_BLOCKS = [b for path in doc_files(ROOT) for b in blocks(ROOT, path)]
SHELL = [c for b in ALL_BLOCKS if b.lang == "sh" for c in commands(b)]
PYTHON = [b for b in ALL_BLOCKS if b.lang == "python"]
WORDS = {"SRC", "OUT", "MODEL", "prompt.txt", "trace.json"}


def _word(name: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w./-]){re.escape(name)}(?![\w.-])")


def substitute(text: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        text = _word(name).sub(value.replace("\\", "\\\\"), text)
    if re.match(r"make(\s|$)", text):
        text = f"make BIN={BIN} -o {BIN}/edge0" + text[len("make") :]
    return text


_SCRATCH: dict[tuple[str, int], dict[str, str]] = {}
_DONE: dict[tuple[str, int, int], subprocess.CompletedProcess[str]] = {}


def _scratch(block: Block, tmp_root: Path, model: Path) -> dict[str, str]:
    key = (block.file, block.line)
    if key not in _SCRATCH:
        d = tmp_root / f"{Path(block.file).stem}-{block.line}"
        d.mkdir(parents=True)
        (d / "prompt.txt").write_text("def parse(s):\n")
        if not re.search(r"\bconvert\b.*\bOUT\b", block.text):
            (d / "OUT").symlink_to(model, target_is_directory=True)
        values = {"SRC": str(ROOT / "edge0/data/teacher"), "OUT": str(d / "OUT"),
                  "MODEL": str(model), "prompt.txt": str(d / "prompt.txt"),
                  "trace.json": str(d / "trace.json")}  # fmt: skip
        for i, (path, shape) in enumerate(synth_paths(block).items()):
            values[path] = str(_synth(shape, d / f"synth-{i}-{shape}"))
        _SCRATCH[key] = values
    return _SCRATCH[key]


def _synth(shape: str, dst: Path) -> Path:
    cmd = [sys.executable, str(ROOT / "tools/synth_checkpoint.py"), "--shape", shape, str(dst)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    assert res.returncode == 0, report(res)
    return dst


def _run(cmd: Command, values: dict[str, str]) -> subprocess.CompletedProcess[str]:
    key = (cmd.block.file, cmd.block.line, cmd.index)
    if key not in _DONE:
        script = "set -euo pipefail\n" + substitute(cmd.text, values)
        _DONE[key] = subprocess.run(["bash", "-c", script], cwd=ROOT, env=subprocess_env(),
                                    capture_output=True, text=True, timeout=TIMEOUT)  # fmt: skip
    return _DONE[key]


@pytest.fixture(scope="module")
def model() -> Path:
    from edge0.model.demo import default_model_path

    return default_model_path()  # conftest.py points EDGE0_CACHE at the session's cache


@pytest.fixture(scope="module")
def scratch_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("docs")


def _param(cmd: Command) -> Any:
    marks = [pytest.mark.skip(reason=f"{cmd.id}: {cmd.skip}")] if cmd.skip else []
    return pytest.param(cmd, id=cmd.id, marks=marks)


def _block_param(block: Block) -> Any:
    name = f"{block.file}:{block.line}"
    reasons = [r for prefix, r in skip_rules(block) if prefix is None]
    marks = [pytest.mark.skip(reason=f"{name}: {reasons[0]}")] if reasons else []
    return pytest.param(block, id=name, marks=marks)


def check_claims(
    cmd: Command, values: dict[str, str], res: subprocess.CompletedProcess[str]
) -> None:
    """What the docs promise about a command beyond its exit code."""
    out = report(res)
    if re.search(r"\bedge0 run\b", cmd.text) or cmd.text.startswith("make run"):
        assert re.search(r"decode: \d+ tok, [\d.]+ tok/s", res.stderr), f"no statistics\n{out}"
    if m := re.search(r"--trace (\S+)", cmd.text):
        trace = json.loads(Path(substitute(m[1], values)).read_text())
        assert trace["traceEvents"], f"empty trace {m[1]}"
    if cmd.text.startswith("edge0 verify"):
        assert res.stdout.startswith("ok: "), out
    if m := re.match(r"edge0 convert \S+ (\S+)", cmd.text):
        assert (Path(substitute(m[1], values)) / "edge0.json").is_file(), out


@pytest.mark.parametrize("cmd", [_param(c) for c in SHELL])
def test_command(cmd: Command, model: Path, scratch_root: Path) -> None:
    values = _scratch(cmd.block, scratch_root, model)
    for earlier in commands(cmd.block)[: cmd.index]:
        if not earlier.skip:
            res = _run(earlier, values)
            assert res.returncode == 0, f"earlier command failed: {earlier.text}\n{report(res)}"
    res = _run(cmd, values)
    assert res.returncode == 0 and "Traceback" not in res.stderr, report(res)
    check_claims(cmd, values, res)


@pytest.mark.parametrize("block", [_block_param(b) for b in PYTHON])
def test_python_block(block: Block, model: Path, scratch_root: Path, tmp_path: Path) -> None:
    values = _scratch(block, scratch_root, model)
    script = tmp_path / "block.py"
    script.write_text(substitute(block.text, values))
    res = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=subprocess_env(),
                         capture_output=True, text=True, timeout=TIMEOUT)  # fmt: skip
    assert res.returncode == 0 and "Traceback" not in res.stderr, report(res)
    assert res.stdout.strip(), f"printed nothing\n{report(res)}"
    if ".summary()" in block.text:
        assert re.search(r"decode: \d+ tok", res.stdout), f"no summary\n{report(res)}"


@pytest.mark.parametrize("block", [pytest.param(b, id=f"{b.file}:{b.line}") for b in PYTHON])
def test_python_block_compiles_and_imports(block: Block) -> None:
    """Skipped or not, a Python block parses and every name it imports exists."""
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT | ast.PyCF_ONLY_AST
    tree = compile(block.text, f"{block.file}:{block.line}", "exec", flags=flags)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module:
            mod = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(mod, alias.name), f"{node.module} has no {alias.name}"


def test_markers() -> None:
    """Every marker is well formed and each `PREFIX` marker still matches a command."""
    for block in ALL_BLOCKS:
        for prefix, _ in skip_rules(block):  # raises on an unknown marker
            if prefix is not None:
                texts = [c.text for c in commands(block)]
                assert any(t.startswith(prefix) for t in texts), (
                    f"{block.file}:{block.line}: `{prefix}` matches none of {texts}"
                )
    assert any(b.file == "README.md" for b in ALL_BLOCKS), "README.md has no command block"


def _documented() -> list[tuple[str, str]]:
    found = [(f"{c.block.file}:{c.block.line}", c.text) for c in SHELL]
    for path in doc_files(ROOT):
        found += [(path.relative_to(ROOT).as_posix(), s) for s in inline_commands(path)]
    return found


def _tokens(text: str) -> list[str]:
    words = shlex.split(text, comments=True)
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        words.pop(0)  # VAR=value prefixes
    stop = next((i for i, w in enumerate(words) if w in {"<", ">", "|", "&&", ";", "&"}
                 or w[:1] in "<>"), len(words))  # fmt: skip
    return [w.strip("[]") for w in words[:stop]]


def cli_problems(words: list[str]) -> list[str]:
    """What in `edge0 ARGS...` names no real subcommand or option of the click CLI."""
    import click

    from edge0.cli.main import main

    node: click.Command = main
    path, problems, i = ["edge0"], [], 1
    while i < len(words):
        word = words[i]
        i += 1
        if word.startswith("-") and word != "-":
            name = word.split("=", 1)[0]
            opts = {o: p for p in node.params if isinstance(p, click.Option)
                    for o in (*p.opts, *p.secondary_opts)}  # fmt: skip
            if name == "--help":
                continue
            if name not in opts:
                problems.append(f"`{' '.join(path)}` has no option {name}")
            elif not (opts[name].is_flag or opts[name].count) and "=" not in word:
                i += 1  # its value
        elif isinstance(node, click.Group) and word not in {"...", ""}:
            names = word.split("|")  # `edge0 train sft|distill`: each must exist
            missing = [n for n in names if n not in node.commands]
            if missing:
                problems.append(f"`{' '.join(path)}` has no command {', '.join(missing)}")
                break
            node, path = node.commands[names[0]], [*path, names[0]]
    return problems


def test_documented_commands_exist() -> None:
    """Every `edge0 ...` and `python tools/x.py ...` in the docs (run or skipped) is real."""
    problems = []
    for where, text in _documented():
        try:
            words = _tokens(text)
        except ValueError as exc:
            problems.append(f"{where}: {text!r}: {exc}")
            continue
        while words and words[0] in {"nohup", "nice", "-n", "10", "sudo", "export"}:
            words.pop(0)
        if words and words[0] == "edge0":
            problems += [f"{where}: {p}" for p in cli_problems(words)]
        elif len(words) > 1 and re.search(r"(^|/)python3?$", words[0]):
            problems += [f"{where}: {p}" for p in _python_problems(words[1:])]
    assert not problems, "documented commands that drifted from the code:\n" + "\n".join(problems)


def _python_problems(args: list[str]) -> list[str]:
    if args[0] == "-m":
        return [] if importlib.util.find_spec(args[1]) else [f"no module {args[1]}"]
    script = ROOT / args[0]
    if not script.is_file():
        return [f"no script {args[0]}"]
    source = script.read_text()
    return [f"{args[0]} has no option {a.split('=')[0]}" for a in args[1:]
            if a.startswith("--") and a.split("=")[0] not in source]  # fmt: skip
