"""An exclusive flock around one benchmark configuration, shared by the tools that take `--lock`."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator


@contextlib.contextmanager
def held(lock: str | None) -> Iterator[None]:
    """Hold an exclusive flock on the file `lock` (shared by benchmarks); nothing when None."""
    if lock is None:
        yield
        return
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
