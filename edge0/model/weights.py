"""Find, validate and load the safetensors files of a checkpoint directory."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import mlx.core as mx

from edge0.errors import ModelLoadError

_FIX = "re-download or re-convert the checkpoint"
_DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "U16": 2,
    "I16": 2,
    "F16": 2,
    "BF16": 2,
    "U32": 4,
    "I32": 4,
    "F32": 4,
    "U64": 8,
    "I64": 8,
    "F64": 8,
}


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a model directory, single-file or sharded.

    A sharded checkpoint lists its shards in model.safetensors.index.json; every listed
    shard must exist. Without an index, all model*.safetensors files are used.
    """
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"{index}: unreadable shard index ({exc}); {_FIX}") from exc
        files = [path / name for name in sorted(set(weight_map.values()))]
        for f in files:
            if not f.exists():
                raise ModelLoadError(f"{f}: shard listed in {index.name} is missing; {_FIX}")
        return files
    files = sorted(path.glob("model*.safetensors"))
    if not files:
        raise ModelLoadError(
            f"{path}: no model*.safetensors weights found; point Edge0 at a Hugging Face or "
            "mlx-lm model directory (config.json + safetensors)"
        )
    return files


def check_safetensors(file: Path) -> dict[str, Any]:
    """Validate a safetensors file's header against its size; return the header.

    Catches truncated downloads and corrupt files before MLX touches them.
    """
    try:
        size = file.stat().st_size
        with open(file, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise ModelLoadError(f"{file}: not a safetensors file (empty or truncated); {_FIX}")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8 or n > 100_000_000:
                raise ModelLoadError(f"{file}: truncated or corrupt safetensors header; {_FIX}")
            header = json.loads(fh.read(n))
    except OSError as exc:
        raise ModelLoadError(f"{file}: cannot read ({exc.strerror}); {_FIX}") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{file}: corrupt safetensors header ({exc}); {_FIX}") from exc
    if not isinstance(header, dict):
        raise ModelLoadError(f"{file}: corrupt safetensors header; {_FIX}")
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, stop = info["data_offsets"]
            count = 1
            for dim in info["shape"]:
                count *= int(dim)
            nbytes = count * _DTYPE_BYTES[info["dtype"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"{file}: corrupt entry for tensor {name}; {_FIX}") from exc
        if stop - begin != nbytes:
            raise ModelLoadError(f"{file}: tensor {name} has a bad byte range; {_FIX}")
        end = max(end, stop)
    expected = 8 + n + end
    if size < expected:
        raise ModelLoadError(
            f"{file}: truncated ({size} bytes, the header needs {expected}); {_FIX}"
        )
    return header


def load_weights(files: list[Path]) -> dict[str, mx.array]:
    """Validate every file, then load all tensors (lazily, as MLX does)."""
    weights: dict[str, mx.array] = {}
    for f in files:
        check_safetensors(f)
        try:
            loaded = mx.load(str(f))
        except Exception as exc:  # MLX raises RuntimeError/ValueError with little context
            raise ModelLoadError(f"{f}: cannot load safetensors ({exc}); {_FIX}") from exc
        assert isinstance(loaded, dict)
        weights.update(loaded)
    return weights


def checkpoint_dtype(weights: dict[str, mx.array]) -> mx.Dtype:
    """The most common floating dtype among the weights (bf16 for most releases)."""
    counts: dict[mx.Dtype, int] = {}
    for w in weights.values():
        if mx.issubdtype(w.dtype, mx.floating):
            counts[w.dtype] = counts.get(w.dtype, 0) + w.size
    return max(counts, key=lambda d: counts[d]) if counts else mx.float32
