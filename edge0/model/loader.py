"""Load HF and mlx-lm MoE checkpoints into mlx-lm models: `edge0.load(path)`."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from edge0.errors import ModelLoadError
from edge0.layout.load import load_layout
from edge0.layout.quant import quantize_stored
from edge0.log import get_logger
from edge0.model import activations
from edge0.model import arch as models
from edge0.model.loaded import LoadedModel, activation_dtype, load_tokenizer
from edge0.model.weights import checkpoint_dtype, load_weights, weight_files

__all__ = ["LoadedModel", "activation_dtype", "build_model", "load", "load_tokenizer"]

log = get_logger(__name__)


def read_config(path: Path) -> dict[str, Any]:
    """config.json (plus eos ids from generation_config.json), normalised for mlx-lm."""
    file = path / "config.json"
    if not file.exists():
        raise ModelLoadError(
            f"{file}: not found; point Edge0 at a model directory with config.json and "
            "*.safetensors (a Hugging Face or mlx-lm checkpoint, or `edge0 convert` output)"
        )
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"{file}: unreadable JSON ({exc}); re-download the checkpoint"
        ) from exc
    if not isinstance(config, dict):
        raise ModelLoadError(f"{file}: not a JSON object; re-download the checkpoint")
    gen = path / "generation_config.json"
    if gen.exists():
        try:
            eos = json.loads(gen.read_text()).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            eos = None
        if eos is not None:
            config["eos_token_id"] = eos
    models.check_supported(config, str(file))
    hf_quant = config.get("quantization_config") or models.text_config(config).get(
        "quantization_config"
    )
    if isinstance(hf_quant, dict) and "quantization" not in config:
        packed = models.family_of(config).hf_quantization(hf_quant)  # gpt-oss MXFP4 experts
        if packed is not None:
            config["quantization"] = packed
    if isinstance(hf_quant, dict) and "quantization" not in config:
        raise ModelLoadError(
            f"{file}: a Hugging Face quantized checkpoint (quant_method "
            f"{hf_quant.get('quant_method')!r}) is not supported; use the bf16/fp16 "
            "checkpoint or an mlx-lm / mlx-community quantized one"
        )
    try:
        return models.normalize_config(config)
    except ModelLoadError as exc:
        raise ModelLoadError(f"{file}: {exc}") from exc


def build_model(config: dict[str, Any], weights: dict[str, mx.array] | None = None) -> nn.Module:
    """The mlx-lm model for `config["model_type"]`, weights not loaded.

    When the config has a "quantization" entry (mlx-lm quantized checkpoints) the
    matching layers are made `QuantizedLinear`/`QuantizedSwitchLinear`: with `weights`
    given (already sanitized), exactly the layers whose `.scales` are present, with the
    bits and group size inferred from them; without, every quantizable layer with the
    config's settings (per-layer entries in the quantization dict win).
    """
    model = models.instantiate(models.normalize_config(config))
    quant = config.get("quantization")
    if isinstance(quant, dict):
        quantize_stored(model, quant, weights)
    return model


def _cast(w: mx.array, dtype: mx.Dtype) -> mx.array:
    return w.astype(dtype) if mx.issubdtype(w.dtype, mx.floating) and w.dtype != dtype else w


def load(path: str | Path) -> LoadedModel:
    """Load a model directory for generation.

    Accepts a Hugging Face checkpoint (config.json + model.safetensors, or shards listed
    in model.safetensors.index.json), an mlx-lm / mlx-community directory (quantized
    when config.json has "quantization"), or an edge0-layout directory (edge0.json,
    handed to `edge0.layout.load.load_layout`). Supported families: see
    `edge0.families` (docs/models.md). Weights are cast to `activation_dtype()`.

    Raises:
        ModelLoadError: missing directory, unsupported model_type, truncated or corrupt
            safetensors, weights that do not match the config, missing tokenizer.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise ModelLoadError(
            f"{path}: no such model directory; check the path (a Hugging Face or mlx-lm "
            "checkpoint directory, or the output of `edge0 convert`)"
        )
    if not path.is_dir():
        raise ModelLoadError(f"{path}: is a file; pass the model directory that contains it")
    if (path / "edge0.json").exists():
        loaded: LoadedModel = load_layout(path)
        return loaded
    start = time.perf_counter()
    config = read_config(path)
    weights = load_weights(weight_files(path))
    stored = checkpoint_dtype(weights)
    is_mlx = "quantization" in config or any(".switch_mlp." in k for k in weights)
    dtype = activation_dtype(stored)
    # Upcast before sanitize: Qwen3.5's sanitize adds 1 to zero-centred norm weights,
    # which loses precision if done in bf16 (mlx-lm does it in the stored dtype).
    weights = {k: _cast(v, dtype) for k, v in weights.items()}
    model = models.instantiate(config, str(path / "config.json"))
    model.eval()
    try:
        # the family's own HF layouts (e.g. per-expert Qwen3.5 tensors) -> what sanitize reads
        weights = models.family_of(config).prepare_hf(weights, models.text_config(config))
        if hasattr(model, "sanitize"):
            weights = model.sanitize(weights)  # HF names/layouts -> mlx-lm's
        act = models.family_of(config).mlp_act
        activations.check(model, activations.rename(model, weights, act), str(path), act)
        if isinstance(config.get("quantization"), dict):
            quantize_stored(model, config["quantization"], weights)
        model.load_weights(list(weights.items()), strict=True)
    except (KeyError, ValueError) as exc:
        detail = str(exc).replace("\n", " ")[:300]
        raise ModelLoadError(
            f"{path}: the safetensors weights do not match config.json ({detail}); the "
            "checkpoint is incomplete or mixed up: re-download it"
        ) from exc
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    eos = config.get("eos_token_id") or models.text_config(config).get("eos_token_id")
    tokenizer = load_tokenizer(path, eos)
    log.info(
        "model.loaded",
        path=str(path),
        model_type=config["model_type"],
        dtype=str(dtype),
        seconds=round(time.perf_counter() - start, 3),
    )
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        config=config,
        path=path,
        source_format="mlx" if is_mlx else "hf",
    )
