"""`edge0 verify`: what opening a layout checks, then every CRC: records, resident, artifacts."""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import attrs
import numpy as np
from tqdm import tqdm

from edge0.errors import CheckpointError
from edge0.layout.artifacts import check_artifacts
from edge0.layout.crc import crc32, file_crc32
from edge0.layout.files import FIX as _FIX
from edge0.layout.files import record_name as _where
from edge0.layout.manifest import EXPERTS_FILE, RESIDENT_FILE, ZSTD_FILE, ZSTD_INDEX_FILE, Manifest
from edge0.log import get_logger

log = get_logger(__name__)
CHUNK = 64 * 1024 * 1024


@attrs.frozen
class VerifyReport:
    """What `verify` checked."""

    records: int
    bytes: int  # bytes read and checksummed (experts.bin, plus experts.zst when present)
    seconds: float
    zstd: bool
    artifacts: tuple[str, ...] = ()  # artifact files checked against their CRC32
    unrecorded: tuple[str, ...] = ()  # artifact files present with no CRC32 in edge0.json

    @property
    def gb_per_s(self) -> float:
        return self.bytes / 1e9 / max(self.seconds, 1e-9)


def _read_chunk(fd: int, buf: np.ndarray, offset: int, nbytes: int) -> int:
    got = os.preadv(fd, [buf.data[:nbytes]], offset)
    if hasattr(os, "posix_fadvise"):  # read once: do not push other data out of the page cache
        os.posix_fadvise(fd, offset, nbytes, os.POSIX_FADV_DONTNEED)
    return got


def _check_experts(path: Path, manifest: Manifest, bar: tqdm) -> None:
    """CRC every record; the next chunk is read in a thread while this one is summed."""
    rs = manifest.record_size
    per_chunk = max(1, CHUNK // rs)
    bufs = [np.empty(per_chunk * rs, dtype=np.uint8) for _ in range(2)]
    fd = os.open(path / EXPERTS_FILE, os.O_RDONLY)
    try:
        with ThreadPoolExecutor(1) as pool:

            def submit(index: int, buf: np.ndarray) -> Future[int]:
                n = min(per_chunk, manifest.n_records - index)
                return pool.submit(_read_chunk, fd, buf, manifest.data_offset + index * rs, n * rs)

            index, turn = 0, 0
            pending = submit(0, bufs[0])
            while index < manifest.n_records:
                n = min(per_chunk, manifest.n_records - index)
                got = pending.result()
                mem = bufs[turn].data[: n * rs]
                if index + n < manifest.n_records:
                    pending = submit(index + n, bufs[1 - turn])
                if got != n * rs:
                    raise CheckpointError(
                        f"{path / EXPERTS_FILE}: short read at {_where(manifest, index)}; {_FIX}"
                    )
                for i in range(n):
                    if crc32(mem[i * rs : (i + 1) * rs]) != manifest.crc32[index + i]:
                        raise CheckpointError(
                            f"{path / EXPERTS_FILE}: {_where(manifest, index + i)} fails its CRC32 "
                            f"check (record {index + i}, "
                            f"offset {manifest.data_offset + (index + i) * rs}); {_FIX}"
                        )
                index += n
                turn = 1 - turn
                bar.update(n * rs)
    finally:
        os.close(fd)


def _check_zstd(path: Path, manifest: Manifest, bar: tqdm) -> int:
    import zstandard

    comp = manifest.compression or {}
    zfile, ifile = path / comp.get("file", ZSTD_FILE), path / comp.get("index", ZSTD_INDEX_FILE)
    for f in (zfile, ifile):
        if not f.is_file():
            raise CheckpointError(f"{f} is missing but edge0.json lists zstd compression; {_FIX}")
    index = np.fromfile(ifile, dtype="<u8")
    if index.size != 2 * manifest.n_records:
        raise CheckpointError(
            f"{ifile} has {index.size // 2} entries for {manifest.n_records} records; {_FIX}"
        )
    index = index.reshape(-1, 2)
    end = int(index[-1, 0] + index[-1, 1]) if len(index) else 0
    if os.path.getsize(zfile) != end:
        raise CheckpointError(
            f"{zfile} has {os.path.getsize(zfile)} bytes, its index ends at {end}; {_FIX}"
        )
    dctx = zstandard.ZstdDecompressor()
    with open(zfile, "rb") as f:
        for i, (off, length) in enumerate(index.tolist()):
            f.seek(off)
            try:
                record = dctx.decompress(f.read(length), max_output_size=manifest.record_size)
            except zstandard.ZstdError as exc:
                raise CheckpointError(
                    f"{zfile}: {_where(manifest, i)} does not decompress ({exc}); {_FIX}"
                ) from None
            if len(record) != manifest.record_size or crc32(record) != manifest.crc32[i]:
                raise CheckpointError(
                    f"{zfile}: {_where(manifest, i)} fails its CRC32 check; {_FIX}"
                )
            bar.update(length)
    return end


def verify(path: Path | str, progress: bool | None = None) -> VerifyReport:
    """Check everything; raise CheckpointError naming the first bad file / layer / expert.

    Args:
        path: an edge0-layout directory.
        progress: show a tqdm bar (None: only on a terminal).
    """
    from edge0.layout.load import check_layout

    path = Path(path)
    start = time.perf_counter()
    manifest = Manifest.load(path)
    check_layout(path)  # everything opening it checks (manifest, files, model, resident)
    crcs = manifest.resident_crc32
    if crcs is not None and file_crc32(path / RESIDENT_FILE) != crcs["file"]:
        raise CheckpointError(f"{path / RESIDENT_FILE} fails its CRC32 check; {_FIX}")
    unrecorded = check_artifacts(path, manifest)
    total = manifest.n_records * manifest.record_size
    disable = None if progress is None else not progress
    with tqdm(total=total, desc="verify", unit="B", unit_scale=True, disable=disable) as bar:
        _check_experts(path, manifest, bar)
    zbytes = 0
    if manifest.compression:
        with tqdm(desc="verify zstd", unit="B", unit_scale=True, disable=disable) as bar:
            zbytes = _check_zstd(path, manifest, bar)
    report = VerifyReport(
        manifest.n_records,
        total + zbytes,
        time.perf_counter() - start,
        bool(manifest.compression),
        tuple(sorted(manifest.artifacts_crc32 or {})),
        tuple(unrecorded),
    )
    log.info(
        "verify.ok",
        path=str(path),
        records=report.records,
        bytes=report.bytes,
        seconds=round(report.seconds, 3),
    )
    return report
