"""Download a hub model's checkpoint files through `huggingface_hub` (its cache, resumed).

Only what a conversion reads is fetched: the top-level safetensors, config, tokenizer
and chat-template files. `huggingface_hub` keeps them in its cache (`HF_HOME`,
`HF_HUB_CACHE`), resumes an interrupted file, honours `HF_HUB_OFFLINE`, `HF_ENDPOINT` and
`HF_TOKEN`, and returns only once every file is complete; a snapshot it reports as
incomplete is never handed on.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import Any

from edge0.errors import ModelLoadError
from edge0.hub.ids import HubId
from edge0.hub.resume import prefetch
from edge0.log import get_logger

log = get_logger(__name__)

# what `edge0 convert` reads (HF and mlx-lm checkpoints); weights in other formats, the
# originals some repos keep in subfolders and the model card are left on the Hub
ALLOW = ["*.safetensors", "*.json", "*.jinja", "*.model", "*.tiktoken", "*.txt"]
IGNORE = ["*/*"]  # top-level files only
SPARE = 256 << 20  # free space kept beyond the download's own size


def fetch(hub: HubId, progress: bool = False) -> Path:
    """The snapshot directory of `hub` in the Hugging Face cache, downloaded as needed.

    Raises ModelLoadError in one line for an unknown repo or revision, a gated or private
    repo without a token, no network (or HF_HUB_OFFLINE=1) with nothing cached, an
    interrupted download and a full disk.
    """
    import huggingface_hub as hf
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars, logging

    (enable_progress_bars if progress else disable_progress_bars)()
    logging.set_verbosity_error()  # its retries' warnings: the outcome is ours to say, once
    kw: dict[str, Any] = {"revision": hub.revision, "allow_patterns": ALLOW}
    kw["ignore_patterns"] = IGNORE
    plan = None
    try:
        if not hf.constants.HF_HUB_OFFLINE:
            plan = hf.snapshot_download(hub.repo, dry_run=True, **kw)
            _check_space(hub, plan)
            prefetch(hub, plan)  # resumable across processes (edge0.hub.resume)
        path = Path(hf.snapshot_download(hub.repo, **kw))
    except Exception as exc:
        raise ModelLoadError(describe(hub, exc, started=plan is not None)) from None
    if not any(path.glob("*.safetensors")):
        raise ModelLoadError(
            f"{hub}: the repo has no top-level *.safetensors files; Edge0 converts "
            "safetensors checkpoints (HF or mlx-community)"
        )
    log.info("hub.fetched", repo=hub.repo, revision=hub.revision, path=str(path))
    return path


def _check_space(hub: HubId, plan: Any) -> None:
    """Refuse up front a download that the cache's disk cannot hold."""
    import huggingface_hub as hf

    need = sum(f.file_size or 0 for f in plan if f.will_download)
    cache = Path(hf.constants.HF_HUB_CACHE)
    cache.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(cache).free
    if need + SPARE > free:
        raise ModelLoadError(_full_disk(hub, cache, need, free))


def _full_disk(hub: HubId, cache: Path, need: int | None, free: int) -> str:
    wants = "" if need is None else f" the download needs {need / 1e9:.1f} GB,"
    return (
        f"{hub}: the disk under the Hugging Face cache ({cache}) is full:{wants} "
        f"{free / 1e9:.1f} GB are free; free some space or point HF_HOME at a larger disk"
    )


def describe(hub: HubId, exc: BaseException, started: bool = True) -> str:
    """One line that says what went wrong with `hub`'s download and what to do about it
    (`started`: the Hub had answered, so a network error interrupted a download)."""
    import huggingface_hub as hf
    from huggingface_hub import errors as e

    if isinstance(exc, ModelLoadError):
        return str(exc)
    if isinstance(exc, e.DryRunError) and exc.__cause__ is not None:
        return describe(hub, exc.__cause__, started)  # the dry run's own reason
    if isinstance(exc, e.DryRunError):  # no reason given: the repo info could not be had
        return (
            f"{hub}: the Hub cannot be reached, or the repo is private (then set HF_TOKEN); "
            "check the network and the id"
        )
    if isinstance(exc, e.GatedRepoError):
        return (
            f"{hub.repo} is gated: accept its terms on its Hugging Face page, then set HF_TOKEN "
            "(or run `hf auth login`) with a token that may read it"
        )
    if isinstance(exc, e.RevisionNotFoundError):
        return f"{hub}: the repo has no revision {hub.revision!r}; give a branch, tag or commit"
    if isinstance(exc, e.RepositoryNotFoundError):
        return (
            f"{hub.repo}: no such model on the Hugging Face Hub, or it is private (then set "
            f"HF_TOKEN), and no directory {hub.repo} here; check the id or the path"
        )
    if isinstance(exc, e.IncompleteSnapshotError):
        return (
            f"{hub}: its download in the Hugging Face cache is incomplete and the Hub cannot "
            "be reached; run again with network access to resume it"
        )
    if isinstance(exc, e.LocalEntryNotFoundError):
        how = (
            "HF_HUB_OFFLINE is set" if hf.constants.HF_HUB_OFFLINE else "the Hub cannot be reached"
        )
        return (
            f"{hub}: not in the Hugging Face cache ({hf.constants.HF_HUB_CACHE}) and {how}; "
            "download it once with network access, or give a local directory"
        )
    if isinstance(exc, e.HfHubHTTPError) and exc.response is not None:
        code = exc.response.status_code
        if code in (401, 403):
            return f"{hub.repo}: the Hub refused access ({code}); check HF_TOKEN"
        return f"{hub}: the Hub answered {code}; try again later"
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        cache = Path(hf.constants.HF_HUB_CACHE)
        return _full_disk(hub, cache, None, shutil.disk_usage(cache).free)
    name = type(exc).__name__
    network = any(word in name for word in ("Timeout", "Connect", "Network", "Protocol"))
    if network and not started:
        return (
            f"{hub}: the Hugging Face Hub cannot be reached ({name}: {_first_line(exc)}); "
            "check the network (HF_ENDPOINT, proxies), or set HF_HUB_OFFLINE=1 to use the cache"
        )
    if network:
        return (
            f"{hub}: the download was interrupted ({name}: {_first_line(exc)}); run the same "
            "command again to resume it"
        )
    return f"{hub}: download failed ({name}: {_first_line(exc)})"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else ""
