"""Hub ids: `ORG/NAME[@REVISION]` told apart from local paths, before any import of the hub."""

from __future__ import annotations

import re
from pathlib import Path

import attrs

from edge0.errors import ModelLoadError

# the Hub's own rule for a repo name: letters, digits, '-', '_', '.'; no '--' or '..', and
# neither end in '-' or '.'
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_ID = re.compile(rf"(?P<repo>{_PART}/{_PART})(?:@(?P<revision>[^\s@]+))?")


@attrs.frozen
class HubId:
    """A model on the Hugging Face Hub: `repo` (ORG/NAME) at `revision` (None: main)."""

    repo: str
    revision: str | None = None

    def __str__(self) -> str:
        return self.repo + (f"@{self.revision}" if self.revision else "")


def parse(text: str) -> HubId | None:
    """The hub id that `text` names, or None when it is a path (one that exists, or one that
    is written as a path: absolute, `./`, `~`, or with more than one `/`)."""
    if Path(text).expanduser().exists() or text.startswith((".", "/", "~")):
        return None
    m = _ID.fullmatch(text)
    if m is None:
        return None
    repo = m["repo"]
    if "--" in repo or ".." in repo:
        raise ModelLoadError(f"{text}: '--' and '..' cannot appear in a Hugging Face repo id")
    return HubId(repo, m["revision"])
