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
Chrome trace, `edge0 verify` says ok, `edge0 convert ... OUT` writes OUT, `curl`
gets a reply that is not an error object.

Too slow for CI: put `<!-- ci: skip (REASON) -->` on the line(s) right above
the block (whole block) or ``<!-- ci: skip `CMD PREFIX` (REASON) -->`` (the
commands starting with CMD PREFIX); the test is reported as skipped with
REASON. `<!-- ci: synth PATH SHAPE -->` runs the block with PATH replaced by a
small checkpoint from `edge0 synth --shape SHAPE` (edge0 layout):
for reruns documented on large scratch models. ``<!-- ci: background `PREFIX`
port N -->``: commands starting with PREFIX (a server, e.g. `edge0 serve`) are
started in the background, N is replaced by a free port in the whole block, the
next command runs once the port accepts connections, and the server is stopped
when this module ends. `edge0 serve ...` needs no marker (port: its --port,
else 8080, and then `--port <free>` is appended; a trailing `&` is dropped).
Pages under docs/benchmarks/ are written by `edge0 bench` and skipped as a
whole. Skipped or not, every documented `edge0 ...` command (blocks and
`inline spans`) must name real subcommands and options, every `python
tools/x.py --opt` a real script and option, and every Python block must
compile and its imports resolve. What runs and what is skipped:
docs/docs-tests.md.
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
import time
from collections.abc import Iterator
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
)
from doc_runner import TIMEOUT, DocRunner, foreground, substitute, substitute_ports
from docs_helpers import ROOT, demo_model, report, subprocess_env

ALL_BLOCKS = [b for path in doc_files(ROOT) for b in blocks(ROOT, path)]
SHELL = [c for b in ALL_BLOCKS if b.lang == "sh" for c in commands(b)]
PYTHON = [b for b in ALL_BLOCKS if b.lang == "python"]
Result = subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocRunner]:
    docs = DocRunner(tmp_path_factory.mktemp("docs"), demo_model(tmp_path_factory))
    yield docs
    docs.close()  # stops the servers that blocks started in the background


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
    """What the docs promise about a command beyond its exit code (a server: that it listens)."""
    out = report(res)
    if cmd.port is not None:
        return
    if cmd.text.startswith("curl "):  # an HTTP reply that is not an error object
        assert res.stdout.strip() and not re.search(r'(?<!\\)"error"\s*:', res.stdout), out
    if re.search(r"\bedge0 run\b", cmd.text) or cmd.text.startswith("make run"):
        assert re.search(r"decode: \d+ tok, [\d.]+ tok/s", res.stderr), f"no statistics\n{out}"
    if m := re.search(r"--trace (\S+)", cmd.text):
        trace = json.loads(Path(substitute(m[1], values)).read_text())
        assert trace["traceEvents"], f"empty trace {m[1]}"
    if cmd.text.startswith("edge0 verify"):
        assert res.stdout.startswith("ok: "), out
    if m := re.match(r"edge0 convert \S+ (\S+)", cmd.text):
        assert (Path(substitute(m[1], values)) / "edge0.json").is_file(), out


@pytest.mark.docs
@pytest.mark.parametrize("cmd", [_param(c) for c in SHELL])
def test_command(cmd: Command, runner: DocRunner) -> None:
    res = runner.run(cmd)
    assert res.returncode == 0 and "Traceback" not in res.stderr, report(res)
    check_claims(cmd, runner.values(cmd.block), res)


@pytest.mark.docs
@pytest.mark.parametrize("block", [_block_param(b) for b in PYTHON])
def test_python_block(block: Block, runner: DocRunner, tmp_path: Path) -> None:
    script = tmp_path / "block.py"
    script.write_text(substitute(block.text, runner.values(block)))
    res = subprocess.run(
        [sys.executable, str(script)],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
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
    stop = next(
        (i for i, w in enumerate(words) if w in {"<", ">", "|", "&&", ";", "&"} or w[:1] in "<>"),
        len(words),
    )
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
            opts = {
                o: p
                for p in node.params
                if isinstance(p, click.Option)
                for o in (*p.opts, *p.secondary_opts)
            }
            if name == "--help":
                continue
            if name not in opts:
                problems.append(f"`{' '.join(path)}` has no option {name}")
            elif not (opts[name].is_flag or opts[name].count) and "=" not in word:
                i += 1  # its value
        elif isinstance(node, click.Group) and word not in {"...", ""}:
            names = re.split(r"[|/]", word)  # `train sft|distill`, `bench tiers/run`: each
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
        problems += [f"{where}: {p}" for p in _command_problems(words)]
    assert not problems, "documented commands that drifted from the code:\n" + "\n".join(problems)


def _command_problems(words: list[str]) -> list[str]:
    """`edge0 ...` or `python tools/x.py ...`; a wrapper's `-- COMMAND` (tools/memcap.py) is
    checked as a command of its own."""
    if words and words[0] == "edge0":
        return cli_problems(words)
    if len(words) > 1 and re.search(r"(^|/)python3?$", words[0]):
        args = words[1:]
        cut = args.index("--") if "--" in args else len(args)
        return _python_problems(args[:cut]) + _command_problems(args[cut + 1 :])
    return []


def _python_problems(args: list[str]) -> list[str]:
    if args[0] == "-m":
        return [] if importlib.util.find_spec(args[1]) else [f"no module {args[1]}"]
    script = ROOT / args[0]
    if not script.is_file():
        return [f"no script {args[0]}"]
    source = script.read_text()
    rest: list[str] = []
    if "--" in args:  # what follows runs as a command of its own
        args, rest = args[: args.index("--")], args[args.index("--") + 1 :]
    problems = [
        f"{args[0]} has no option {a.split('=')[0]}"
        for a in args[1:]
        if a.startswith("--") and a.split("=")[0] not in source
    ]
    if rest and "/" not in rest[0]:  # `-- ARGS` of `edge0` (scripts/pool_share.py), not a
        problems += cli_problems(["edge0", *rest])  # program's path (tools/netns_ranks.py)
    return problems


def test_servers_and_multiline_commands() -> None:
    """`edge0 serve` is a server (its port, else 8080); a quoted argument may span lines."""
    text = (
        "edge0 serve &    # the demo model\n"
        "edge0 serve OUT --port 9000\n"
        "KEY=x edge0 serve --port 0\n"
        'curl -s http://127.0.0.1:8080/v1/x -d \'{\n  "a": 1, "b": 0}\'\n'
    )
    first, second, third, curl = commands(Block("README.md", 1, "sh", text, ()))
    assert (first.text, first.port) == ("edge0 serve", "8080")
    assert (second.port, third.port, curl.port) == ("9000", "0", None)
    assert curl.text == 'curl -s http://127.0.0.1:8080/v1/x -d \'{\n  "a": 1, "b": 0}\''
    ports = {"8080": "5001", "0": "5002"}
    assert substitute_ports(third.text, ports) == "KEY=x edge0 serve --port 5002"
    assert substitute_ports(curl.text, ports) == curl.text.replace(":8080/", ":5001/")


def test_background_marker(tmp_path: Path) -> None:
    """A block that starts a server (``background `PREFIX` port N``), then talks to it."""
    fetch = "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8080/').status)"
    text = f'python3 -m http.server 8080 --bind 127.0.0.1\npython3 -c "{fetch}"'
    block = Block("docs/x.md", 1, "sh", text, ("background `python3 -m http.server` port 8080",))
    docs = DocRunner(tmp_path, tmp_path)
    try:
        server, client = commands(block)
        assert docs.run(server).returncode == 0
        res = docs.run(client)
        assert res.returncode == 0 and res.stdout.strip() == "200", report(res)
        assert "8080" not in substitute_ports(client.text, docs.ports(block))  # a free one
    finally:
        docs.close()


def test_a_hanging_command_is_stopped_with_its_children(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    res = foreground(f"sleep 60 & echo $! > {pidfile}; wait", timeout=1)
    assert res.returncode == -9 and "timed out after 1 s" in res.stderr
    pid = int(pidfile.read_text())

    def gone() -> bool:
        try:
            return "zombie" in Path(f"/proc/{pid}/status").read_text()
        except FileNotFoundError:
            return True

    # the child got the signal with its group; on a busy machine it may not have run yet
    deadline = time.monotonic() + 10
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(), f"sleep (pid {pid}) outlived its stopped command"
