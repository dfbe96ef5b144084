"""Unmerged recovery LoRA over the resident projections, stored in mlx-lm's adapter format."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from edge0.errors import ConfigError, ModelLoadError
from edge0.log import get_logger

log = get_logger(__name__)

ADAPTER_DIR = "adapters"
WEIGHTS_FILE = "adapters.safetensors"
CONFIG_FILE = "adapter_config.json"
LORA_LEAVES = ("lora_a", "lora_b")

# Layer-relative module paths that the default target set may contain: attention
# projections (full and gated attention), Gated-DeltaNet projections and the shared
# expert. The router (`mlp.gate`) and the routed/streamed experts are never targets.
DEFAULT_TARGET_PATTERNS = (
    r"self_attn\.(q|k|v|o)_proj",
    r"linear_attn\.(in_proj_[a-z]+|out_proj)",
    r"mlp\.shared_expert\.(gate|up|down)_proj",
)
_NEVER = re.compile(r"(^|\.)(switch_mlp|experts|gate|router|shared_expert_gate)(\.|$)")


@attrs.frozen
class LoraConfig:
    """Rank, alpha and targets of a recovery adapter; scale = alpha / rank as in the paper."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    keys: tuple[str, ...] | None = None  # layer-relative paths; None = DEFAULT_TARGET_PATTERNS
    num_layers: int = -1  # last N layers get adapters; -1 = all

    def __attrs_post_init__(self) -> None:
        if self.rank < 1:
            raise ConfigError(f"LoRA rank must be >= 1, got {self.rank}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"LoRA dropout must be in [0, 1), got {self.dropout}")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def _dims(base: nn.Module) -> tuple[int, int]:
    """(input_dims, output_dims) of an nn.Linear or nn.QuantizedLinear."""
    out_dims, packed_in = base.weight.shape
    if isinstance(base, nn.QuantizedLinear):
        return packed_in * 32 // base.bits, out_dims
    return packed_in, out_dims


class LoRALinear(nn.Module):
    """y = base(x) + scale * (x @ lora_a) @ lora_b, i.e. W x + (alpha/r) B A x with A = lora_a^T.

    Parameter names (`linear`, `lora_a` of shape (in, r), `lora_b` of shape (r, out))
    match mlx-lm's tuner so adapter files are interchangeable.
    """

    def __init__(self, base: nn.Module, rank: int, scale: float, dropout: float = 0.0) -> None:
        super().__init__()
        if not isinstance(base, (nn.Linear, nn.QuantizedLinear)):
            raise ConfigError(f"LoRA needs an nn.Linear or nn.QuantizedLinear, got {type(base)}")
        in_dims, out_dims = _dims(base)
        self.linear = base
        self.scale = scale
        self.dropout = dropout
        bound = 1.0 / math.sqrt(in_dims)  # A ~ U(-1/sqrt(in), 1/sqrt(in)), B = 0: starts as base
        self.lora_a = mx.random.uniform(-bound, bound, (in_dims, rank))  # (in, r)
        self.lora_b = mx.zeros((rank, out_dims))  # (r, out)

    def delta(self, x: mx.array) -> mx.array:
        """The low-rank branch alone: scale * (x A^T) B^T, in x's dtype."""
        if self.dropout > 0 and self.training:
            keep = mx.random.bernoulli(1.0 - self.dropout, x.shape)
            x = mx.where(keep, x / (1.0 - self.dropout), mx.zeros_like(x))
        z = (x @ self.lora_a.astype(x.dtype)) @ self.lora_b.astype(x.dtype)  # (..., out)
        return z * self.scale

    def __call__(self, x: mx.array) -> mx.array:
        y = self.linear(x)
        return y + self.delta(x).astype(y.dtype)

    def delta_weight(self) -> mx.array:
        """The dense update scale * B A of shape (out, in), fp32."""
        a = self.lora_a.astype(mx.float32)
        b = self.lora_b.astype(mx.float32)
        return self.scale * (b.T @ a.T)


def model_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of an mlx-lm model (what mlx-lm's `num_layers` counts from the end)."""
    layers = getattr(model, "layers", None)
    if layers is None:
        raise ConfigError(f"{type(model).__name__} has no `layers`; cannot place LoRA adapters")
    return list(layers)


def _selected_layers(model: nn.Module, num_layers: int) -> list[nn.Module]:
    layers = model_layers(model)
    if num_layers < 0 or num_layers >= len(layers):
        return layers
    return layers[len(layers) - num_layers :]


def _is_linear(m: nn.Module) -> bool:
    return isinstance(m, (nn.Linear, nn.QuantizedLinear))


def default_keys(model: nn.Module) -> tuple[str, ...]:
    """Layer-relative paths of every projection matching DEFAULT_TARGET_PATTERNS, sorted."""
    patterns = [re.compile(p + "$") for p in DEFAULT_TARGET_PATTERNS]
    keys: set[str] = set()
    for layer in model_layers(model):
        for path, m in layer.named_modules():
            if _is_linear(m) and not _NEVER.search(path):
                if any(p.fullmatch(path) for p in patterns):
                    keys.add(path)
    return tuple(sorted(keys))


def apply_lora(model: nn.Module, config: LoraConfig) -> list[str]:
    """Wrap the target projections in LoRALinear (in place). Returns the full module paths.

    Raises ConfigError when a requested key matches nothing or names a routed expert.
    """
    keys = tuple(config.keys) if config.keys is not None else default_keys(model)
    for key in keys:
        if _NEVER.search(key):
            raise ConfigError(f"LoRA target {key!r} is a router or routed expert; remove it")
    found: set[str] = set()
    layers = model_layers(model)
    for layer in _selected_layers(model, config.num_layers):
        wrapped = []
        for path, m in layer.named_modules():
            if path in keys and _is_linear(m):
                wrapped.append((path, LoRALinear(m, config.rank, config.scale, config.dropout)))
                found.add(path)
        if wrapped:
            layer.update_modules(tree_unflatten(wrapped))
    missing = sorted(set(keys) - found)
    if missing:
        raise ConfigError(f"LoRA targets {missing} match no nn.Linear in any layer of the model")
    paths = lora_paths(model)
    log.info("lora.applied", modules=len(paths), keys=list(keys), layers=len(layers))
    return paths


def lora_modules(model: nn.Module) -> list[tuple[str, LoRALinear]]:
    return [(p, m) for p, m in model.named_modules() if isinstance(m, LoRALinear)]


def lora_paths(model: nn.Module) -> list[str]:
    return sorted(p for p, _ in lora_modules(model))


def remove_lora(model: nn.Module) -> int:
    """Unwrap every LoRALinear back to its base layer (in place). Returns how many."""
    mods = lora_modules(model)
    if mods:
        model.update_modules(tree_unflatten([(p, m.linear) for p, m in mods]))
    return len(mods)


def mark_trainable(model: nn.Module) -> int:
    """Freeze everything except the LoRA matrices. Returns the number of trainable scalars."""
    model.freeze()
    for _, m in lora_modules(model):
        m.unfreeze(keys=list(LORA_LEAVES), recurse=False)
    flat: list[tuple[str, mx.array]] = tree_flatten(model.trainable_parameters())  # type: ignore[assignment]
    return sum(v.size for _, v in flat)


def adapter_weights(model: nn.Module) -> dict[str, mx.array]:
    """Full-path name -> array for every lora_a / lora_b in the model."""
    out: dict[str, mx.array] = {}
    for path, m in lora_modules(model):
        out[f"{path}.lora_a"] = m.lora_a
        out[f"{path}.lora_b"] = m.lora_b
    return out


def _layer_keys(model: nn.Module) -> list[str]:
    """Layer-relative paths of the LoRALinear modules currently in the model."""
    keys: set[str] = set()
    for layer in model_layers(model):
        keys.update(p for p, m in layer.named_modules() if isinstance(m, LoRALinear))
    return sorted(keys)


def save_adapters(
    model: nn.Module, out_dir: str | Path, config: LoraConfig, meta: dict[str, Any] | None = None
) -> Path:
    """Write adapters.safetensors + adapter_config.json (mlx-lm's fields, plus `edge0` meta)."""
    weights = adapter_weights(model)
    if not weights:
        raise ConfigError("the model has no LoRA layers to save; call apply_lora first")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / WEIGHTS_FILE), weights, metadata={"format": "mlx"})
    doc = {
        "fine_tune_type": "lora",
        "num_layers": len(_selected_layers(model, config.num_layers)),
        "lora_parameters": {
            "rank": config.rank,
            "scale": config.scale,
            "alpha": config.alpha,
            "dropout": config.dropout,
            "keys": _layer_keys(model),
        },
        "edge0": dict(meta or {}),
    }
    (out / CONFIG_FILE).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    log.info("lora.saved", path=str(out), tensors=len(weights))
    return out


def read_config(adapter_dir: str | Path) -> tuple[LoraConfig, dict[str, Any]]:
    """Parse adapter_config.json into a LoraConfig (+ the whole document)."""
    path = Path(adapter_dir) / CONFIG_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelLoadError(
            f"{path} is missing; re-save the adapter or pass --no-adapter"
        ) from None
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path} is not valid JSON ({exc}); re-save the adapter") from None
    kind = doc.get("fine_tune_type", "lora")
    params = doc.get("lora_parameters") or {}
    if kind != "lora" or "rank" not in params or "scale" not in params:
        raise ModelLoadError(
            f"{path}: only LoRA adapters with lora_parameters.rank/scale are supported "
            f"(fine_tune_type={kind!r}); re-train it with `edge0 train sft`"
        )
    rank = int(params["rank"])
    alpha = float(params.get("alpha", float(params["scale"]) * rank))
    keys = params.get("keys")
    cfg = LoraConfig(
        rank=rank,
        alpha=alpha,
        dropout=float(params.get("dropout", 0.0)),
        keys=tuple(keys) if keys is not None else None,
        num_layers=int(doc.get("num_layers", -1)),
    )
    return cfg, doc


def load_adapters(model: nn.Module, adapter_dir: str | Path) -> LoraConfig:
    """Wrap the model's targets per adapter_config.json and load the LoRA weights (strictly)."""
    adapter_dir = Path(adapter_dir)
    cfg, _ = read_config(adapter_dir)
    wpath = adapter_dir / WEIGHTS_FILE
    if not wpath.exists():
        raise ModelLoadError(f"{wpath} is missing; re-save the adapter or pass --no-adapter")
    remove_lora(model)
    try:
        apply_lora(model, cfg)
    except ConfigError as exc:
        remove_lora(model)
        raise ModelLoadError(f"{adapter_dir} does not fit this model: {exc}") from None
    weights = mx.load(str(wpath))
    assert isinstance(weights, dict)
    _check_weights(model, weights, wpath)
    model.load_weights(list(weights.items()), strict=False)
    mx.eval(model.parameters())
    log.info("lora.loaded", path=str(adapter_dir), tensors=len(weights), rank=cfg.rank)
    return cfg


def _check_weights(model: nn.Module, weights: dict[str, mx.array], wpath: Path) -> None:
    expected = adapter_weights(model)
    problems = [f"{k} unexpected" for k in sorted(set(weights) - set(expected))]
    problems += [f"{k} missing" for k in sorted(set(expected) - set(weights))]
    problems += [
        f"{k} has shape {tuple(weights[k].shape)}, model wants {tuple(v.shape)}"
        for k, v in sorted(expected.items())
        if k in weights and weights[k].shape != v.shape
    ]
    if problems:
        remove_lora(model)
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise ModelLoadError(
            f"{wpath} does not match this model: {'; '.join(problems[:3])}{more}; "
            "it was trained for another model — retrain it or pass --no-adapter"
        )


def maybe_apply_adapters(model: nn.Module, model_dir: str | Path, enabled: bool = True) -> bool:
    """Runtime hook: load MODEL/adapters/ when present and enabled. Returns True if applied."""
    adir = Path(model_dir) / ADAPTER_DIR
    if not enabled:
        if adir.exists():
            log.info("lora.disabled", path=str(adir))
        return False
    if not adir.is_dir():
        return False
    load_adapters(model, adir)
    return True
