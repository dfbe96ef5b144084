"""Source checkpoints for `edge0 convert`: find tensors across shards and read experts one by one.

Three ways routed experts appear in a source, all read per (layer, expert) by byte range:
- per-expert HF tensors under the family's block and projection names (`Family.block_attr`,
  `hf_projections`): `...layers.N.mlp.experts.E.{gate,up,down}_proj.weight` by default;
- fused HF tensors: `...layers.N.mlp.experts.gate_up_proj` (E, 2*ff, d) and
  `...experts.down_proj` (E, d, ff) (gate is the first half of gate_up);
- stacked MLX tensors: `...layers.N.mlp.switch_mlp.{gate,up,down}_proj.{weight,scales,biases}`,
  quantized (mlx-community int4) or plain float (with a `.bias` each where the experts have
  biases);
- a family's own fused layout (`Family.fused_expert` / `read_fused`: e.g. interleaved
  gate_up tensors, float or MXFP4 blocks, which stay packed: `packed`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import attrs

from edge0.errors import ConversionError, ModelLoadError
from edge0.families import Family, family_for
from edge0.layout.readable import ARTIFACT_FILES
from edge0.layout.records import PROJECTIONS
from edge0.layout.safetensors_io import TensorInfo, read_header, read_raw
from edge0.log import get_logger
from edge0.model.arch import check_supported, normalize_config

log = get_logger(__name__)

_FUSED = re.compile(
    r"^(?P<pre>.*layers\.(?P<layer>\d+)\.(mlp|block_sparse_moe))\.experts\.(?P<proj>gate_up_proj|down_proj)$"
)
_STACKED = re.compile(
    r"^(?P<pre>.*layers\.(?P<layer>\d+)\.(mlp|block_sparse_moe|feed_forward))\.(switch_mlp|experts)\."
    r"(?P<proj>gate_proj|up_proj|down_proj)\.(?P<part>weight|scales|biases|bias)$"
)
_DROPPED_PREFIXES = (
    "mtp.",
    "model.mtp.",
    "vision_tower",
    "model.visual",
    "vision_model",
    "multi_modal_projector",
)


@attrs.define
class LayerExperts:
    """The source tensors holding one layer's routed experts."""

    kind: str  # "per_expert" | "fused" | "stacked" | "family"
    tensors: dict[str, TensorInfo] = attrs.field(factory=dict)  # key: see _classify


@attrs.define
class Source:
    """An opened source checkpoint directory (nothing but headers read yet)."""

    path: Path
    config: dict[str, Any]
    tensors: dict[str, TensorInfo]
    experts: dict[int, LayerExperts]  # model layer index -> expert tensors
    resident_keys: list[str]
    quantized: bool  # an MLX checkpoint with "quantization" in its config
    family: Family
    # the experts' quantization when an HF source stores them packed (MXFP4 blocks)
    packed: dict[str, Any] | None = None

    @property
    def format(self) -> str:
        return "mlx" if self.quantized else "hf"

    def read_expert(self, layer: int, expert: int) -> dict[str, Any]:
        """One expert's tensors as raw numpy arrays (storage dtype) plus their dtype names.

        Returns:
            {"gate_proj": (raw, dtype), ...} for float sources, or
            {"gate_proj.weight": (raw, dtype), "gate_proj.scales": ..., ...} for quantized ones.
        """
        le = self.experts[layer]
        out: dict[str, Any] = {}
        if le.kind == "per_expert":
            for proj in PROJECTIONS:
                info = le.tensors[f"{expert}.{proj}"]
                out[proj] = (read_raw(info), info.dtype)
        elif le.kind == "family":

            def read(key: str, e: int) -> tuple[Any, str]:
                return read_raw(le.tensors[key], (e, e + 1))[0], le.tensors[key].dtype

            out = self.family.read_fused(read, set(le.tensors), expert)
        elif le.kind == "fused":
            gu, down = le.tensors["gate_up_proj"], le.tensors["down_proj"]
            both = read_raw(gu, (expert, expert + 1))[0]  # (2*ff, d)
            mid = both.shape[0] // 2
            out["gate_proj"] = (both[:mid], gu.dtype)
            out["up_proj"] = (both[mid:], gu.dtype)
            out["down_proj"] = (read_raw(down, (expert, expert + 1))[0], down.dtype)
        else:
            for name, info in le.tensors.items():
                raw = read_raw(info, (expert, expert + 1))[0]
                key = name if self.quantized or name.endswith(".bias") else name.split(".")[0]
                out[key] = (raw, info.dtype)
        return out


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as exc:
            raise ConversionError(f"{index} is unreadable ({exc}); fix or remove it") from None
        files = sorted({path / f for f in weight_map.values()})
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise ConversionError(f"{index} lists missing shards: {', '.join(missing)}")
        return files
    # Trained artifacts next to the weights (prerouter heads of both horizons, adapters)
    # are not weights.
    not_weights = {*ARTIFACT_FILES, "adapters.safetensors"}
    files = sorted(path.glob("model*.safetensors")) or sorted(
        f for f in path.glob("*.safetensors") if f.name not in not_weights
    )
    if not files:
        raise ConversionError(f"{path} has no *.safetensors files; point at a model directory")
    return files


def _classify(
    tensors: dict[str, TensorInfo], family: Family
) -> tuple[dict[int, LayerExperts], list[str]]:
    experts: dict[int, LayerExperts] = {}
    resident: list[str] = []

    def add(layer: str, kind: str, key: str, info: TensorInfo) -> None:
        le = experts.setdefault(int(layer), LayerExperts(kind))
        if le.kind != kind:
            raise ConversionError(f"layer {layer} mixes {le.kind} and {kind} expert tensors")
        le.tensors[key] = info

    per_expert = family.per_expert_pattern()
    for name, info in tensors.items():
        if name.startswith(_DROPPED_PREFIXES):
            continue  # multi-token-prediction / vision weights: mlx-lm drops them too
        if hit := family.fused_expert(name):
            add(str(hit[0]), "family", hit[1], info)
        elif m := per_expert.match(name):
            proj = family.hf_projections[m["proj"]]
            add(m["layer"], "per_expert", f"{m['e']}.{proj}", info)
        elif m := _FUSED.match(name):
            add(m["layer"], "fused", m["proj"], info)
        elif m := _STACKED.match(name):
            add(m["layer"], "stacked", f"{m['proj']}.{m['part']}", info)
        else:
            resident.append(name)
    return experts, sorted(resident)


def open_source(path: Path) -> Source:
    """Read config.json and every safetensors header of a source checkpoint."""
    path = Path(path)
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise ConversionError(f"{cfg_path} not found: SRC must be a Hugging Face or MLX model dir")
    try:
        config = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as exc:
        raise ConversionError(f"{cfg_path} is unreadable ({exc})") from None
    if not isinstance(config, dict):
        raise ConversionError(f"{cfg_path} is not a JSON object; re-download the checkpoint")
    try:
        check_supported(config, str(cfg_path))
        normalize_config(config)  # the check `edge0 run` makes: refused here, before any write
    except ModelLoadError as exc:
        text = str(exc)
        raise ConversionError(
            text if text.startswith(str(cfg_path)) else f"{cfg_path}: {text}"
        ) from None
    family = family_for(str(config["model_type"]))
    tensors: dict[str, TensorInfo] = {}
    for f in _weight_files(path):
        tensors.update(read_header(f))
    experts, resident = _classify(tensors, family)
    if not experts:
        raise ConversionError(
            f"{path}: found no routed-expert tensors of {config['model_type']} (per-expert "
            f"{family.per_expert_pattern().pattern}, fused or switch_mlp); the weights do not "
            "match config.json"
        )
    quantized = "quantization" in config
    hf_quant = config.get("quantization_config")
    packed = None
    if not quantized and isinstance(hf_quant, dict):
        packed = family.hf_quantization(hf_quant)
        if packed is None:
            raise ConversionError(
                f"{cfg_path}: a Hugging Face quantized checkpoint (quant_method "
                f"{hf_quant.get('quant_method')!r}) is not supported; convert the bf16/fp16 "
                "checkpoint or an mlx-lm / mlx-community quantized one"
            )
    for layer, le in experts.items():
        if (
            quantized
            and le.kind == "stacked"
            and not any(k.endswith(".scales") for k in le.tensors)
        ):
            raise ConversionError(f"{path}: config says quantized but layer {layer} has no scales")
    log.info(
        "source.opened",
        path=str(path),
        format="mlx" if quantized else "hf",
        tensors=len(tensors),
        moe_layers=len(experts),
    )
    return Source(path, config, tensors, experts, resident, quantized, family, packed)


def expert_bias_dtype(source: Source) -> str | None:
    """The dtype of the experts' own projection biases, None when they have none."""
    le = next(iter(source.experts.values()))
    found = [i.dtype for k, i in le.tensors.items() if k.endswith(("_bias", ".bias"))]
    return found[0] if found else None


def expert_count(le: LayerExperts) -> int:
    """Number of experts stored for one layer."""
    if le.kind == "per_expert":
        return len({k.split(".")[0] for k in le.tensors})
    any_info = next(iter(le.tensors.values()))
    return any_info.shape[0]
