"""What a load returns (`LoadedModel`), the dtype Edge0 computes in, and the tokenizer loader.

Shared by both loaders (edge0.model.loader for HF/mlx-lm checkpoints,
edge0.layout.load for edge0-layout directories); imports neither.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import mlx.nn as nn

from edge0.errors import ModelLoadError
from edge0.families import FAMILIES
from edge0.kernels.layers import use_native
from edge0.model import arch as models


@attrs.define
class LoadedModel:
    """A model ready to generate.

    Attributes:
        model: the mlx-lm `nn.Module` (call it as `model(tokens[None], cache=...)`).
        tokenizer: mlx-lm's `TokenizerWrapper` (HF tokenizer + streaming detokenizer).
        config: the normalised config.json dict (see `edge0.model.arch.normalize_config`).
        path: the model directory.
        source_format: "hf" (Hugging Face checkpoint), "mlx" (mlx-lm / mlx-community
            directory, quantized or not) or "edge0" (an edge0-layout directory).
    """

    model: nn.Module
    tokenizer: Any
    config: dict[str, Any]
    path: Path
    source_format: str

    def __attrs_post_init__(self) -> None:
        # quantized layers run the native CPU kernels where they can (edge0.kernels)
        use_native(self.model)

    @property
    def text_config(self) -> dict[str, Any]:
        """The language-model fields (Qwen3.5 nests them under `text_config`)."""
        return models.text_config(self.config)

    @property
    def context_length(self) -> int:
        """Longest sequence (prompt + generated tokens) the model supports."""
        return int(self.text_config.get("max_position_embeddings") or 1 << 30)


def activation_dtype(checkpoint: mx.Dtype | None = None) -> mx.Dtype:
    """The dtype Edge0 computes in: float32 on the CPU backend, else the checkpoint's.

    On the CPU backend fp16/bf16 matmuls are 10-50x slower than fp32 (measured), so
    weights are upcast. On Metal/CUDA the checkpoint dtype (usually bf16) is kept.
    """
    if mx.default_device().type == mx.DeviceType.cpu:
        return mx.float32
    return checkpoint if checkpoint is not None else mx.bfloat16


def load_tokenizer(path: Path, eos_token_ids: Any = None) -> Any:
    """mlx-lm's TokenizerWrapper for the tokenizer files in `path`."""
    from mlx_lm.tokenizer_utils import load as load_wrapper

    if not (path / "tokenizer.json").exists() and not (path / "tokenizer_config.json").exists():
        raise ModelLoadError(
            f"{path}: no tokenizer.json or tokenizer_config.json; copy the tokenizer files "
            "from the original checkpoint into this directory"
        )
    if isinstance(eos_token_ids, int):
        eos_token_ids = [eos_token_ids]
    try:
        return load_wrapper(path, _read_as(path), eos_token_ids=eos_token_ids)
    except Exception as exc:  # transformers raises many types for broken tokenizer files
        raise ModelLoadError(
            f"{path}: cannot load the tokenizer ({type(exc).__name__}: {exc}); copy the "
            "tokenizer files from the original checkpoint"
        ) from exc


def _read_as(path: Path) -> dict[str, Any]:
    """The config transformers' tokenizer loader should take, where it cannot read config.json
    itself: a model_type it has no class for (kimi_k2) is read as its family's config class
    (its generic reading fails on a `rope_scaling`, though the tokenizer is fine)."""
    file = path / "config.json"
    model_type = json.loads(file.read_text()).get("model_type") if file.is_file() else None
    family = FAMILIES.get(str(model_type))
    if family is None or model_type not in family.config_types:
        return {}
    import transformers

    return {"config": transformers.AutoConfig.for_model(family.config_types[str(model_type)])}
