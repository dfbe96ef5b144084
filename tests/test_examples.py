r"""Every program in examples/ runs as its docstring says: subprocess runs, output checked.

Examples are discovered: every `examples/*.py` whose name does not start with
`_` is a test subject. An example opts in with lines in its module docstring
(each `ci-...:` line starts at the beginning of a line):

    ci-run: ARGS         one run per line, ARGS split like a shell would (no line:
                         one run with no arguments). Placeholders: {model} = the
                         committed tiny qwen3_5_moe fixture converted to the edge0
                         layout, {demo} = the shipped demo model (converted into the
                         session's EDGE0_CACHE), {port} = a free TCP port (the same
                         one ci-serve gets), {tmp} = an empty scratch directory.
    ci-expect: REGEX     must match the run's stdout (re.search, re.MULTILINE; use
                         (?s) to span lines). At least one per example: an exit
                         code alone proves nothing.
    ci-serve: COMMAND    started before each run whose ARGS use {port}, stopped
                         after it (e.g. `edge0 serve {model} --port {port}`); the
                         run starts once the port accepts connections. `edge0`
                         is this venv's.
    ci-bad-args: ARGS    a wrong command line that must print a usage line and exit
                         2 without a traceback (repeatable; default: an unknown
                         option, a MODEL_DIR that does not exist, {hf} = a Hugging
                         Face checkpoint not yet converted, {broken} = a directory
                         whose edge0.json is not JSON).
    ci-skip: REASON      the example is not run in CI; reported as skipped, with REASON.

Runs happen in an empty scratch directory with the same environment as the
tests (conftest.py points EDGE0_CACHE at the session's temporary cache, so the
demo model is converted once per session, never into ~/.cache).
"""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
from docs_helpers import FIXTURES, ROOT, demo_model, free_port, subprocess_env, tail, tiny_layout
from docs_helpers import report as output

EXAMPLES = ROOT / "examples"
RUN_TIMEOUT = 240  # seconds per run; a loaded 2-core machine is slow, a hang is not
DEFAULT_BAD_ARGS = ("--no-such-option", "/no/such/model-dir", "{hf}", "{broken}")


@attrs.frozen
class Example:
    path: Path
    runs: tuple[str, ...]
    expect: tuple[str, ...]
    serve: str | None
    bad_args: tuple[str, ...]
    skip: str | None
    doc: str

    @property
    def name(self) -> str:
        return self.path.name


def _directives(doc: str, key: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(rf"^{key}:(.*)$", doc, re.MULTILINE)]


def parse_example(path: Path) -> Example:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    serve = _directives(doc, "ci-serve")
    skip = _directives(doc, "ci-skip")
    return Example(
        path=path,
        runs=tuple(_directives(doc, "ci-run")) or ("",),
        expect=tuple(_directives(doc, "ci-expect")),
        serve=serve[0] if serve else None,
        bad_args=tuple(_directives(doc, "ci-bad-args")) or DEFAULT_BAD_ARGS,
        skip=skip[0] if skip else None,
        doc=doc,
    )


ALL = [parse_example(p) for p in sorted(EXAMPLES.glob("*.py")) if not p.name.startswith("_")]


def _params(per_example: Any) -> list[Any]:
    out = []
    for ex in ALL:
        for case_id, values in per_example(ex):
            marks = [pytest.mark.skip(reason=f"{ex.name}: {ex.skip}")] if ex.skip else []
            out.append(pytest.param(ex, *values, id=case_id, marks=marks))
    return out


@pytest.fixture(scope="module")
def placeholders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return {
        "model": str(tiny_layout(tmp_path_factory.mktemp("examples-model"))),
        "demo": str(demo_model(tmp_path_factory)),
    }


def _fill(template: str, values: dict[str, str]) -> list[str]:
    return [arg.format(**values) for arg in shlex.split(template)]


def _start_server(command: list[str], port: int, cwd: Path) -> subprocess.Popen[bytes]:
    import socket

    log = cwd / "server.log"  # a file, not a pipe: a chatty server never blocks on it
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            command, cwd=cwd, env=subprocess_env(), stdout=out, stderr=subprocess.STDOUT
        )
    deadline = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.2)
    _stop(proc)
    pytest.fail(f"ci-serve {command}: not listening on {port}:\n{tail(log.read_text())}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.mark.docs
@pytest.mark.parametrize(
    ("example", "args"),
    _params(lambda ex: [(f"{ex.name}[{args or 'no args'}]", (args,)) for args in ex.runs]),
)
def test_example_runs(
    example: Example, args: str, placeholders: dict[str, str], tmp_path: Path
) -> None:
    assert example.expect, f"{example.name}: add at least one `ci-expect: REGEX` docstring line"
    values = dict(placeholders, port=str(free_port()), tmp=str(tmp_path))
    server = (
        _start_server(_fill(example.serve, values), int(values["port"]), tmp_path)
        if example.serve and "{port}" in args
        else None
    )
    try:
        res = subprocess.run(
            [sys.executable, str(example.path), *_fill(args, values)],
            cwd=tmp_path,
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
        )
    finally:
        if server is not None:
            _stop(server)
    report = output(res)
    assert res.returncode == 0, report
    assert "Traceback" not in res.stderr, report
    for pattern in example.expect:
        assert re.search(pattern, res.stdout, re.MULTILINE), f"no match for {pattern!r}\n{report}"


@pytest.mark.docs
@pytest.mark.parametrize(
    ("example", "bad"),
    _params(lambda ex: [(f"{ex.name}[{bad}]", (bad,)) for bad in ex.bad_args]),
)
def test_example_usage_error(example: Example, bad: str, tmp_path: Path) -> None:
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "edge0.json").write_text("{not json")
    values = {"hf": str(FIXTURES / "qwen3_moe"), "broken": str(tmp_path / "broken")}
    res = subprocess.run(
        [sys.executable, str(example.path), *_fill(bad, values)],
        cwd=tmp_path,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    report = output(res)
    assert res.returncode == 2, report
    assert res.stderr.startswith("usage: "), report
    assert "Traceback" not in res.stderr, report
    assert re.search(r"error: .+", res.stderr), report


@pytest.mark.parametrize("example", [pytest.param(ex, id=ex.name) for ex in ALL])
def test_example_docstring_names_itself(example: Example) -> None:
    """The docstring's `Run:` line is the command a reader copies; it must name this file."""
    run_lines = re.findall(r"^Run: (.*)$", example.doc, re.MULTILINE)
    assert any(f"examples/{example.name}" in line for line in run_lines), (
        f"{example.name}: the docstring needs a `Run: python examples/{example.name} ...` line"
    )


def test_examples_are_discovered() -> None:
    names = {ex.name for ex in ALL}
    assert {"compare_tiers.py", "custom_tier.py", "serve_two_clients.py"} <= names


def test_a_missing_optional_dependency_names_its_extra() -> None:
    code = (
        "import sys; sys.path.insert(0, 'examples'); sys.argv = ['x.py']; import _model; "
        "_model.need('edge0_no_such_package', 'test')"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=60,
    )
    assert res.returncode == 2 and res.stdout == "", output(res)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install -e '.[test]'" in lines[0], output(res)
