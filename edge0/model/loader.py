"""Load HF and mlx-lm MoE checkpoints into mlx-lm models: `edge0.load(path)`."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import mlx.nn as nn

from edge0.errors import ModelLoadError
from edge0.log import get_logger
from edge0.model import arch as models
from edge0.model.weights import checkpoint_dtype, load_weights, weight_files

log = get_logger(__name__)

_DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


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

    On the CPU backend fp16/bf16 matmuls are 10-50x slower than fp32 (FACTS.md), so
    weights are upcast. On Metal/CUDA the checkpoint dtype (usually bf16) is kept.
    """
    if mx.default_device().type == mx.DeviceType.cpu:
        return mx.float32
    return checkpoint if checkpoint is not None else mx.bfloat16


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
        _quantize(model, quant, weights)
    return model


def _quantize(model: nn.Module, quant: dict[str, Any], weights: dict[str, mx.array] | None) -> None:
    from mlx_lm.utils import infer_quant_config

    def predicate(path: str, module: nn.Module) -> bool | dict[str, Any]:
        if path in quant and isinstance(quant[path], (dict, bool)):
            return quant[path]
        if not hasattr(module, "to_quantized"):
            return False
        if weights is None:
            return True
        if f"{path}.scales" not in weights:
            return False
        return dict(infer_quant_config(path, module, weights))

    nn.quantize(
        model,
        group_size=quant.get("group_size", 64),
        bits=quant.get("bits", 4),
        mode=quant.get("mode", "affine"),
        class_predicate=predicate,
    )


def _cast(w: mx.array, dtype: mx.Dtype) -> mx.array:
    return w.astype(dtype) if mx.issubdtype(w.dtype, mx.floating) and w.dtype != dtype else w


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
        return load_wrapper(path, eos_token_ids=eos_token_ids)
    except Exception as exc:  # transformers raises many types for broken tokenizer files
        raise ModelLoadError(
            f"{path}: cannot load the tokenizer ({type(exc).__name__}: {exc}); copy the "
            "tokenizer files from the original checkpoint"
        ) from exc


def load(path: str | Path) -> LoadedModel:
    """Load a model directory for generation.

    Accepts a Hugging Face checkpoint (config.json + model.safetensors, or shards listed
    in model.safetensors.index.json), an mlx-lm / mlx-community directory (quantized
    when config.json has "quantization"), or an edge0-layout directory (edge0.json,
    handed to `edge0.layout.load.load_layout`). Supported families: see
    `edge0.routing.families` (docs/models.md). Weights are cast to `activation_dtype()`.

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
        from edge0.layout.load import load_layout

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
        if isinstance(config.get("quantization"), dict):
            _quantize(model, config["quantization"], weights)
        model.load_weights(list(weights.items()), strict=True)
    except (KeyError, ValueError) as exc:
        detail = str(exc).replace("\n", " ")[:300]
        raise ModelLoadError(
            f"{path}: the safetensors weights do not match config.json ({detail}); the "
            "checkpoint is incomplete or mixed up: re-download or re-convert it"
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
