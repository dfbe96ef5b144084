"""Files a command is about to read, checked up front: a regular file that opens, or one error.

What users meet: a file copied with another user's permissions, a symbolic link into
a model cache whose target was deleted, a directory where a file belongs. Each is a
one-line error naming the file, what is wrong with it and the fix, before any work.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from edge0.errors import Edge0Error

# tokenizer and generation files a model directory may hold (copied by `edge0 convert`)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "tiktoken.model",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)
# quality artifacts trained for a model travel with it (docs/prerouter.md, docs/lora.md)
ARTIFACT_FILES = (
    "prerouter.safetensors",
    "prerouter.json",
    "prerouter-layer.safetensors",
    "prerouter-layer.json",
)


def check_readable(path: Path, fix: str, error: type[Edge0Error]) -> None:
    """Raise `error` unless `path` is a regular file this process can open for reading."""
    if path.is_symlink() and not path.exists():
        raise error(
            f"{path} is a symbolic link to {os.readlink(path)}, which does not exist; {fix}"
        )
    if path.is_dir():
        raise error(f"{path} is a directory where a file belongs; {fix}")
    if not path.exists():
        raise error(f"{path} is missing; {fix}")
    st = path.stat()
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block the open below
        raise error(f"{path} is not a regular file (a FIFO, socket or device); {fix}")
    try:
        os.close(os.open(path, os.O_RDONLY))
    except OSError as exc:
        raise error(
            f"{path} cannot be read: {exc.strerror} (mode {stat.filemode(st.st_mode)}, owner "
            f"uid {st.st_uid}; this process runs as uid {os.geteuid()}); fix its permissions, "
            f"e.g. `chmod a+r {path}`, or {fix}"
        ) from None


def check_present(
    directory: Path, names: tuple[str, ...], fix: str, error: type[Edge0Error]
) -> None:
    """`check_readable` for each of `names` that has an entry in `directory` (a broken link
    included): optional files, but a present one must be readable."""
    for name in names:
        if os.path.lexists(directory / name):
            check_readable(directory / name, fix, error)
