"""Downloads that survive the process: each missing file goes to a fixed partial file in the
Hugging Face cache and resumes there with a Range request, whatever ended the last try.

`huggingface_hub` resumes a file only within one call (its retries); a new process starts
the file again in a temporary file of its own. A checkpoint of many gigabytes cut by
Ctrl-C, a kill or a dropped network should not start again from zero, so the files a
conversion needs are fetched here first, into the cache's documented layout
(`models--ORG--NAME/blobs/ETAG`, linked from `snapshots/COMMIT/NAME`), and
`snapshot_download` then finds them in place.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from edge0.hub.ids import HubId
from edge0.log import get_logger

log = get_logger(__name__)
PART = ".edge0-part"  # a blob being downloaded: blobs/ETAG.edge0-part


def prefetch(hub: HubId, plan: Sequence[Any]) -> None:
    """Download every file of `plan` (snapshot_download's dry run) that is not cached yet."""
    for item in plan:
        if item.will_download:
            _fetch(hub, item)


def _fetch(hub: HubId, item: Any) -> None:
    import huggingface_hub as hf
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    url = hf.hf_hub_url(hub.repo, item.filename, revision=item.commit_hash)
    meta = hf.get_hf_file_metadata(url)
    link = Path(item.local_path)  # snapshots/COMMIT/NAME (top-level files only)
    blob = link.parents[2] / "blobs" / str(meta.etag)
    if not blob.exists():
        blob.parent.mkdir(parents=True, exist_ok=True)
        part = blob.with_name(blob.name + PART)
        fd = os.open(part, os.O_RDWR | os.O_CREAT, 0o644)
        with _locked(part), os.fdopen(fd, "r+b") as fh:
            if not blob.exists():  # another process finished it while this one waited
                fh.seek(0, os.SEEK_END)
                done = fh.tell()
                if done:
                    log.info("hub.resume", file=item.filename, bytes=done, size=meta.size)
                http_get(
                    str(meta.location or url),
                    fh,
                    resume_size=done,
                    headers=build_hf_headers(),
                    expected_size=meta.size,
                    displayed_filename=item.filename,
                )
                fh.flush()
                os.fsync(fh.fileno())
                os.replace(part, blob)
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        with contextlib.suppress(FileExistsError):  # a concurrent process linked it first
            os.symlink(os.path.relpath(blob, link.parent), link)


@contextlib.contextmanager
def _locked(part: Path) -> Iterator[None]:
    """An exclusive lock on `part`'s own lock file: one writer per partial file."""
    with open(part.with_name(part.name + ".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
