"""A hub model converted once: its edge0 layout in the edge0 cache, keyed by repo, commit and
the conversion's options, and reused by every later `run`, `serve` and `tune`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import attrs

from edge0.errors import ConversionError
from edge0.hub.download import fetch
from edge0.hub.ids import HubId
from edge0.layout.convert import ConvertOptions, convert
from edge0.layout.manifest import MANIFEST_FILE
from edge0.log import get_logger
from edge0.model.demo import cache_dir

log = get_logger(__name__)
HUB_DIR = "hub"  # under the edge0 cache: hub/ORG--NAME/<commit>-<options>/


def layout_dir(hub: HubId, commit: str, opts: ConvertOptions) -> Path:
    """Where the layout of `hub` at `commit`, converted with `opts`, lives in the cache."""
    options = attrs.asdict(attrs.evolve(opts, force=False))
    key = json.dumps({"repo": hub.repo, "commit": commit, "options": options}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache_dir() / HUB_DIR / hub.repo.replace("/", "--") / f"{commit[:12]}-{digest}"


def converted(hub: HubId, opts: ConvertOptions | None = None, progress: bool = False) -> Path:
    """The edge0 layout of `hub`: downloaded and converted on first use, then reused.

    The conversion writes its output atomically (edge0.layout.atomic), so an interrupted
    one leaves no half layout behind; of two processes converting at once, the first
    to finish wins and the other uses its output.
    """
    opts = opts or ConvertOptions()
    source = fetch(hub, progress)
    target = layout_dir(hub, source.name, opts)  # a snapshot's directory is named by its commit
    if (target / MANIFEST_FILE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("hub.convert", repo=hub.repo, commit=source.name, target=str(target))
    try:
        convert(source, target, attrs.evolve(opts, force=False))
    except ConversionError:
        if not (target / MANIFEST_FILE).is_file():  # not another process's finished output
            raise
    return target
