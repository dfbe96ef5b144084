"""Calibration text: the user's file, or the Python standard library's sources on this machine.

Both give two parts: the text the heads learn from and held-out text they are validated
on. The standard library is on every machine Edge0 runs on, so `edge0 tune` needs no
download; its files are split by a hash of their path (one in ten held out), the same on
every machine with the same Python.
"""

from __future__ import annotations

import sysconfig
import zlib
from pathlib import Path

import attrs

from edge0.errors import ConfigError

HELDOUT_EVERY = 10  # one file (or the last tenth of a user's text) in ten is held out
SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__"}


@attrs.frozen
class Corpus:
    train: str
    heldout: str
    source: str  # what the text is, for the validation record

    def check(self, train_chars: int, heldout_chars: int) -> None:
        for name, text, want in (
            ("calibration", self.train, train_chars),
            ("held-out", self.heldout, heldout_chars),
        ):
            if len(text) < want:
                raise ConfigError(
                    f"{self.source}: {len(text):,} characters of {name} text, {want:,} needed; "
                    "give a longer --corpus or fewer --tokens"
                )


def from_file(path: str | Path) -> Corpus:
    """A user's text file (UTF-8); its last tenth is held out. A directory with train.txt
    and heldout.txt (tools/build_corpus.py's output) gives its two parts as they are."""
    p = Path(path)
    if p.is_dir():
        parts = [p / "train.txt", p / "heldout.txt"]
        if not all(f.is_file() for f in parts):
            raise ConfigError(f"{p}: a corpus directory needs train.txt and heldout.txt")
        return Corpus(_read(parts[0]), _read(parts[1]), source=str(p))
    text = _read(p)
    cut = len(text) - len(text) // HELDOUT_EVERY
    return Corpus(text[:cut], text[cut:], source=str(p))


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such corpus file; give a UTF-8 text file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}); convert it") from None


def builtin(train_chars: int, heldout_chars: int) -> Corpus:
    """Python sources of the running interpreter's standard library, as much as asked for."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if not SKIP_DIRS & set(p.relative_to(root).parts))
    train: list[str] = []
    held: list[str] = []
    sizes = [0, 0]
    for p in files:
        held_out = zlib.crc32(p.relative_to(root).as_posix().encode()) % HELDOUT_EVERY == 0
        part, want = (held, heldout_chars) if held_out else (train, train_chars)
        if sizes[held_out] >= want:
            continue
        text = p.read_text(encoding="utf-8", errors="replace")
        part.append(text)
        sizes[held_out] += len(text)
        if sizes[0] >= train_chars and sizes[1] >= heldout_chars:
            break
    return Corpus("\n".join(train), "\n".join(held), source=f"Python {_version()} stdlib")


def _version() -> str:
    return sysconfig.get_python_version()
