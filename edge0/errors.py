"""Edge0's exceptions: one base class, each error says what went wrong and the fix."""

from __future__ import annotations


class Edge0Error(Exception):
    """Base of every error Edge0 raises on purpose.

    The message is one line that names the file, layer or expert involved and
    what the user can do about it. The CLI prints it and exits with code 2.
    """


class ModelLoadError(Edge0Error):
    """A model directory is missing, unsupported or malformed."""


class CheckpointError(Edge0Error):
    """An edge0-layout checkpoint fails validation (manifest, sizes, CRCs)."""


class ConversionError(Edge0Error):
    """`edge0 convert` cannot convert a source checkpoint."""


class ConfigError(Edge0Error):
    """Bad options: an unknown tier, a malformed spec string, a bad size."""


class PromptError(Edge0Error):
    """The prompt cannot be served (for example longer than the context)."""


class RequestError(Edge0Error):
    """An HTTP request to `edge0 serve` that cannot be served as sent (body, field, size, key).

    `status` is the HTTP status to answer with; `param` names the offending field;
    `headers` go with the answer (Retry-After).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.status = status
        self.param = param
        self.code = code
        self.headers = headers or {}
        super().__init__(message)


class TierReadError(Edge0Error):
    """A tier failed to deliver one expert record after its retry."""

    def __init__(
        self,
        reason: str,
        *,
        file: str | None = None,
        layer: int | None = None,
        expert: int | None = None,
        offset: int | None = None,
    ) -> None:
        self.reason = reason
        self.file = file
        self.layer = layer
        self.expert = expert
        self.offset = offset
        where = []
        if file is not None:
            where.append(f"file {file}")
        if layer is not None:
            where.append(f"layer {layer}")
        if expert is not None:
            where.append(f"expert {expert}")
        if offset is not None:
            where.append(f"offset {offset}")
        super().__init__(
            f"reading {', '.join(where) or 'an expert record'} failed: {reason}; "
            "run `edge0 verify` on the model directory, or re-convert it"
        )


class RankError(Edge0Error):
    """A rank of a multi-machine pipeline failed, hung or could not start."""
