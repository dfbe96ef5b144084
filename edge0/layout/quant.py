"""Which tensors are quantized, and how: mlx-lm convert's choices, and rebuilding them on load.

mlx-lm's `convert -q` casts floating parameters to the config's dtype (except where the
model's `cast_predicate` says no, e.g. `A_log`), then quantizes every module that has
`to_quantized` and whose input width is a multiple of the group size, asking the model's
`quant_predicate` for per-module overrides (routers `mlp.gate` and `shared_expert_gate`
get 8 bits in some families). Edge0 makes the same choices so that an edge0
checkpoint computes exactly what mlx-lm's int4 conversion of the same source computes.
`quantize_stored` makes a float-shaped model's layers quantized where a checkpoint
(an mlx-lm quantized one or an edge0 layout) stores them quantized.
"""

from __future__ import annotations

import re
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.switch_layers import SwitchGLU

from edge0.errors import ConversionError

CONVERSION_DTYPES = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}
_LAYER = re.compile(r"layers\.(\d+)\.")


def conversion_dtype(config: dict[str, Any]) -> mx.Dtype | None:
    """The dtype mlx-lm's convert casts floating parameters to (None: keep the source's)."""
    name = config.get("torch_dtype")
    if name is None and isinstance(config.get("text_config"), dict):
        name = config["text_config"].get("dtype")
    return CONVERSION_DTYPES.get(name) if isinstance(name, str) else None


def cast_allowed(model: nn.Module, key: str) -> bool:
    predicate = getattr(model, "cast_predicate", None)
    return True if predicate is None else bool(predicate(key))


def switch_modules(model: nn.Module) -> dict[int, tuple[str, SwitchGLU]]:
    """Model layer index -> (module path, SwitchGLU) for every layer with routed experts."""
    out: dict[int, tuple[str, SwitchGLU]] = {}
    for path, module in model.named_modules():
        if isinstance(module, SwitchGLU):
            m = _LAYER.search(path)
            if m is None or path.startswith("mtp"):
                continue
            out[int(m.group(1))] = (path, module)
    if not out:
        raise ConversionError("the model has no SwitchGLU (routed expert) blocks")
    return dict(sorted(out.items()))


def quant_params(
    model: nn.Module, path: str, module: nn.Module, defaults: dict[str, Any]
) -> dict[str, Any] | None:
    """Quantization parameters for one module, or None to keep it in float.

    Mirrors mlx-lm's `quantize_model`: only modules with `to_quantized` whose input width
    divides the group size, then the model's `quant_predicate` (True, False or a dict).
    """
    if not hasattr(module, "to_quantized") or not hasattr(module, "weight"):
        return None
    if module.weight.shape[-1] % defaults["group_size"] != 0:
        return None
    predicate = getattr(model, "quant_predicate", None)
    decision: Any = True if predicate is None else predicate(path, module)
    if isinstance(decision, dict):
        return {"mode": defaults["mode"], **decision}
    return dict(defaults) if decision else None


def expert_projections(model: nn.Module, defaults: dict[str, Any]) -> dict[str, dict[str, int]]:
    """The expert projections mlx-lm's `quant_predicate` quantizes other than `defaults`.

    {proj: {bits, group_size}} (e.g. `switch_mlp.down_proj` at 8 bits); every MoE
    layer must get the same answer (one record shape), else ConversionError.
    """
    predicate = getattr(model, "quant_predicate", None)
    found: dict[str, dict[str, int]] | None = None
    first = 0
    for layer, (path, switch) in switch_modules(model).items():
        own: dict[str, dict[str, int]] = {}
        for proj in ("gate_proj", "up_proj", "down_proj"):
            decision = True if predicate is None else predicate(f"{path}.{proj}", switch[proj])
            if decision is False:
                raise ConversionError(
                    f"layer {layer}: the model's quant_predicate keeps {path}.{proj} in float; "
                    "an edge0 expert record is quantized"
                )
            if isinstance(decision, dict):
                bits = int(decision.get("bits", defaults["bits"]))
                group = int(decision.get("group_size", defaults["group_size"]))
                if (bits, group) != (defaults["bits"], defaults["group_size"]):
                    own[proj] = {"bits": bits, "group_size": group}
        if found is None:
            found, first = own, layer
        elif own != found:
            raise ConversionError(
                f"layer {layer}'s experts are quantized differently from layer {first}'s by the "
                "model's quant_predicate; the edge0 layout needs one record shape for all layers"
            )
    return found or {}


RESIDENT_KINDS = ("embed", "attn")  # what `edge0 convert --embed-bits/--attn-bits` select


def resident_kind(path: str) -> str | None:
    """ "embed" for the token embedding and the LM head, "attn" for attention projections."""
    leaf = path.rpartition(".")[2]
    if leaf in ("embed_tokens", "lm_head"):
        return "embed"
    if ".self_attn." in path or ".linear_attn." in path:
        return "attn"
    return None


def with_resident_bits(
    path: str, params: dict[str, Any] | None, bits: dict[str, int]
) -> dict[str, Any] | None:
    """`params` with the bits `bits` gives this module's kind (RESIDENT_KINDS), if any."""
    kind = resident_kind(path)
    if params is None or kind not in bits:
        return params
    return {**params, "bits": bits[kind]}


def quantized_shapes(
    shape: tuple[int, ...], params: dict[str, Any]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of (packed weight, scales/biases) for a float weight of `shape`."""
    *lead, in_dims = shape
    bits, gs = params["bits"], params["group_size"]
    return (*lead, in_dims * bits // 32), (*lead, in_dims // gs)


def quantize(w: mx.array, params: dict[str, Any]) -> tuple[mx.array, mx.array, mx.array]:
    """Affine-quantize `w` along its last axis; returns (packed weight, scales, biases)."""
    if params.get("mode", "affine") != "affine":
        raise ConversionError(f"quantization mode {params['mode']!r} is not supported (affine)")
    wq, scales, biases = mx.quantize(w, group_size=params["group_size"], bits=params["bits"])
    return wq, scales, biases


def quantize_stored(
    model: nn.Module,
    quant: dict[str, Any],
    weights: dict[str, mx.array] | None,
    fixed: dict[str, dict[str, Any]] | None = None,
) -> None:
    """Quantize the layers of `model` the way a checkpoint stores them (in place).

    `quant` is a config's quantization dict: defaults (group_size, bits, mode) and
    per-layer entries (a dict of settings, or False). With `weights` given, exactly
    the layers whose `.scales` are present, per-layer entries first, else bits and
    group size inferred from the tensors; without, every quantizable layer. Layers
    in `fixed` get those settings whatever the weights say (an edge0 layout's experts).
    """
    from mlx_lm.utils import infer_quant_config

    fixed = fixed or {}

    def predicate(path: str, module: nn.Module) -> bool | dict[str, Any]:
        if path in fixed:
            return fixed[path]
        if not hasattr(module, "to_quantized"):
            return False
        entry = quant.get(path)
        if weights is not None and f"{path}.scales" not in weights:
            return False
        if isinstance(entry, dict):
            return {"mode": "affine", **entry}
        if isinstance(entry, bool):
            return entry
        return True if weights is None else dict(infer_quant_config(path, module, weights))

    nn.quantize(
        model,
        group_size=quant.get("group_size", 64),
        bits=quant.get("bits", 4),
        mode=quant.get("mode", "affine"),
        class_predicate=predicate,
    )
