"""The commands and Python blocks of README.md and docs/, as test_docs.py runs and checks them."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import attrs

SHELL_LANGS = {"sh", "bash", "shell", "console"}
PYTHON_LANGS = {"python", "py"}
# An untagged block is a shell block when its first command starts like one.
COMMAND_START = re.compile(
    r"^(\$ )?(edge0|make|python3?|\.venv/bin/\S+|export|sudo|nohup|nice|pip|curl|mlx\.launch"
    r"|[A-Z_][A-Z0-9_]*=\S*)(\s|$)"
)
FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)")
MARKER = re.compile(r"^<!--\s*ci:\s*(.*?)\s*-->\s*$")
SKIP = re.compile(r"^skip\s+(?:`(?P<prefix>[^`]+)`\s+)?\((?P<reason>.+)\)$")
SYNTH = re.compile(r"^synth\s+(?P<path>\S+)\s+(?P<shape>[\w.-]+)$")
BACKGROUND = re.compile(r"^background\s+`(?P<prefix>[^`]+)`\s+port\s+(?P<port>\d+)$")
GENERATED = "docs/benchmarks/"  # pages written by `edge0 bench ... --md`: no hand-made markers


@attrs.frozen
class Block:
    file: str  # relative to the repo root
    line: int  # of the opening fence
    lang: str  # "sh" or "python" (untagged command blocks count as "sh")
    text: str
    markers: tuple[str, ...]  # the `<!-- ci: ... -->` lines right above the fence


@attrs.frozen
class Command:
    block: Block
    index: int  # position in its block
    text: str  # continuation lines joined, comments kept (bash ignores them)
    skip: str | None  # the reason, when marked
    port: str | None = None  # a server: the port the docs say it listens on (run in background)

    @property
    def id(self) -> str:
        words = " ".join(self.text.split("#")[0].split()[:4])
        return f"{self.block.file}:{self.block.line}#{self.index} {words}"


def doc_files(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def blocks(root: Path, path: Path) -> list[Block]:
    """Every fenced block of `path` that is shell commands or Python."""
    lines = path.read_text().splitlines()
    rel = path.relative_to(root).as_posix()
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i].strip())
        if not m:
            i += 1
            continue
        end = next(
            (j for j in range(i + 1, len(lines)) if lines[j].strip().startswith(m[1])), len(lines)
        )
        body = "\n".join(lines[i + 1 : end])
        lang = m[2].lower()
        if lang in SHELL_LANGS or (not lang and _looks_like_commands(body)):
            found.append(Block(rel, i + 1, "sh", body, _markers(lines, i)))
        elif lang in PYTHON_LANGS:
            found.append(Block(rel, i + 1, "python", body, _markers(lines, i)))
        i = end + 1
    return found


def _looks_like_commands(body: str) -> bool:
    first = next((ln.strip() for ln in body.splitlines() if ln.strip()), "")
    return bool(COMMAND_START.match(first))


def _markers(lines: list[str], fence: int) -> tuple[str, ...]:
    out, j = [], fence - 1
    while j >= 0 and (not lines[j].strip() or MARKER.match(lines[j].strip())):
        if m := MARKER.match(lines[j].strip()):
            out.append(m[1])
        j -= 1
    return tuple(reversed(out))


def skip_rules(block: Block) -> list[tuple[str | None, str]]:
    """(command prefix or None for the whole block, reason) for each skip marker of `block`.

    Raises:
        ValueError: a marker that is not `skip (REASON)`, ``skip `PREFIX` (REASON)``,
            `synth PATH SHAPE` or ``background `PREFIX` port N``.
    """
    rules: list[tuple[str | None, str]] = []
    for marker in block.markers:
        if SYNTH.match(marker) or BACKGROUND.match(marker):
            continue
        m = SKIP.match(marker)
        if not m:
            raise ValueError(f"{block.file}:{block.line}: unknown marker <!-- ci: {marker} -->")
        rules.append((m["prefix"], m["reason"]))
    if block.file.startswith(GENERATED) and not rules:
        rules.append(
            (
                None,
                "benchmark page written by `edge0 bench`: its rerun takes minutes "
                "on the synthetic models",
            )
        )
    return rules


def synth_paths(block: Block) -> dict[str, str]:
    """PATH -> SHAPE for each `synth PATH SHAPE` marker: in CI, PATH is a synthetic checkpoint."""
    return {m["path"]: m["shape"] for m in map(SYNTH.match, block.markers) if m}


def server_port(block: Block, text: str) -> str | None:
    """The documented port when `text` starts a server: a ``background `PREFIX` port N``
    marker names it, or it is `edge0 serve` (its --port, else the default 8080)."""
    for m in map(BACKGROUND.match, block.markers):
        if m and text.startswith(m["prefix"]):
            return m["port"]
    if re.match(r"([A-Z_][A-Z0-9_]*=\S*\s+)*edge0 serve\b", text):
        m = re.search(r"--port[ =](\d+)", text)
        return m[1] if m else "8080"
    return None


def commands(block: Block) -> list[Command]:
    """The block's commands: continuation lines and open quotes joined, blank and comment
    lines dropped; a server's trailing `&` is dropped (the runner puts it in the background)."""
    rules = skip_rules(block)
    joined: list[str] = []
    pending = ""
    for raw in block.text.splitlines():
        line = pending + raw.rstrip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not _complete(line):
            pending = line + "\n"
            continue
        pending = ""
        stripped = line.strip().removeprefix("$ ")
        if stripped and not stripped.startswith("#"):
            joined.append(stripped)
    if pending.strip():
        joined.append(pending.strip())  # unbalanced quotes: bash will say so
    out = []
    for i, text in enumerate(joined):
        reason = next((r for prefix, r in rules if prefix is None or text.startswith(prefix)), None)
        port = server_port(block, text)
        if port is not None:
            text = re.sub(r"\s*&\s*(#.*)?$", "", text)
        out.append(Command(block, i, text, reason, port))
    return out


def _complete(line: str) -> bool:
    try:
        shlex.split(line, comments=True)
    except ValueError:  # no closing quotation: the command goes on on the next line
        return False
    return True


def inline_commands(path: Path) -> list[str]:
    """Commands in `code spans` of the prose (outside fenced blocks) that start like a command."""
    text, inside, spans = path.read_text(), False, []
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            inside = not inside
            continue
        if not inside:
            spans += [s for s in re.findall(r"`([^`]+)`", line) if COMMAND_START.match(s)]
    return spans
