"""MODEL arguments: a local directory as it is, a hub id as its download or cached layout."""

from __future__ import annotations

from pathlib import Path

from edge0.hub.ids import parse


def source(model: str, progress: bool = False) -> Path:
    """The checkpoint directory MODEL names: itself, or a hub id's downloaded snapshot."""
    hub = parse(model)
    if hub is None:
        return Path(model).expanduser()
    from edge0.hub.download import fetch

    return fetch(hub, progress)


def runnable(model: str, progress: bool = False) -> Path:
    """The directory to run for MODEL: itself, or a hub id's edge0 layout (downloaded and
    converted on first use, from the edge0 cache after that)."""
    hub = parse(model)
    if hub is None:
        return Path(model).expanduser()
    from edge0.hub.layouts import converted

    return converted(hub, progress=progress)
