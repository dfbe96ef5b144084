"""Shared by the examples: their command line (a usage line on bad input) and the model directory.

Every example takes an optional MODEL_DIR (an `edge0 convert` output); without
one it uses the shipped demo model, which `edge0.model.demo` converts once into
the cache ($EDGE0_CACHE or ~/.cache/edge0). Parsing happens before MLX is
imported, so a wrong argument costs a fraction of a second.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from edge0.errors import Edge0Error  # light: no MLX


def positive(text: str) -> int:
    """argparse type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parser(doc: str | None, *, max_tokens: int | None = None) -> argparse.ArgumentParser:
    """An argument parser with MODEL_DIR (optional) and, when given a default, --max-tokens."""
    summary = (doc or "").strip().splitlines()[0] if doc else None
    p = argparse.ArgumentParser(description=summary)
    p.add_argument(
        "model",
        nargs="?",
        metavar="MODEL_DIR",
        help="an edge0-layout directory (edge0 convert output); default: the shipped demo model",
    )
    if max_tokens is not None:
        p.add_argument(
            "--max-tokens",
            type=positive,
            default=max_tokens,
            help=f"tokens to generate per request (default {max_tokens})",
        )
    return p


def resolve_model(p: argparse.ArgumentParser, given: str | None) -> Path:
    """The model directory: `given` when it is an edge0 layout (else a usage error), or the demo."""
    if given is None:
        from edge0.model.demo import default_model_path

        try:
            return default_model_path()  # converts the shipped teacher on first use
        except Edge0Error as exc:
            p.exit(2, f"{p.prog}: error: {exc}\n")
    path = Path(given)
    if not path.is_dir():
        p.error(f"MODEL_DIR {given!r} is not a directory")
    if not (path / "edge0.json").is_file():
        is_hf = (path / "config.json").is_file()
        hint = f"; convert it first: edge0 convert {given} OUT" if is_hf else ""
        p.error(f"MODEL_DIR {given!r} is not an edge0-layout directory (no edge0.json){hint}")
    from edge0.layout.manifest import Manifest

    try:
        Manifest.load(path)  # a damaged manifest: one line here, not a traceback later
    except Edge0Error as exc:
        p.error(f"MODEL_DIR {given!r}: {exc}")
    return path


def parse_args(
    doc: str | None, *, max_tokens: int | None = None, argv: Sequence[str] | None = None
) -> argparse.Namespace:
    """Parse the example's command line; `.model` is the resolved model directory (a Path)."""
    p = parser(doc, max_tokens=max_tokens)
    args = p.parse_args(argv)
    args.model = resolve_model(p, args.model)
    return args


def model_dir() -> Path:
    """MODEL_DIR from the command line (checked), else the demo model in the edge0 layout."""
    return parse_args(sys.modules["__main__"].__doc__).model


def need(module: str, extra: str) -> object:
    """Import an optional dependency, or exit 2 with one line naming the extra to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        prog = Path(sys.argv[0]).name
        print(
            f"{prog}: error: needs the {module!r} package: pip install -e '.[{extra}]' "
            f"(or pip install {module})",
            file=sys.stderr,
        )
        sys.exit(2)
