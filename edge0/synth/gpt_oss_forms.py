"""The other forms a gpt-oss checkpoint comes in, made from a transformers-layout one.

- `hub_mxfp4`: the hub's original release layout (openai/gpt-oss-*): experts as MXFP4
  `*_blocks` (E, out, in/32, 16) uint8 and `*_scales` (E, out, in/32) uint8, gate and up
  interleaved by rows, `quantization_config.quant_method = "mxfp4"`; everything else as
  in the source. The packing is MLX's `mode="mxfp4"` (what mlx-lm reads the hub files as).
Both write the config with `rope_scaling` / `rope_theta` filled in (as the hub's
config.json has them; mlx-lm does not read transformers 5's `rope_parameters`).
- `mlx_names`: the same float weights under mlx-lm's names (`mlp.experts.gate_proj.weight`
  (E, F, d), `...gate_proj.bias`), the form of an mlx-community bf16 repository; mlx-lm's
  `sanitize` reads only these two forms, not transformers' (E, d, 2F) tensors.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx

from edge0.families import family_for
from edge0.model.arch import normalize_config

_SIDE = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _copy_side(src: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in _SIDE:
        if (src / name).is_file():
            shutil.copy2(src / name, out / name)


def hub_mxfp4(src: Path, out: Path) -> Path:
    """Write `src` (transformers layout, float) as the hub's MXFP4 release into `out`."""
    _copy_side(src, out)
    weights = mx.load(str(src / "model.safetensors"))
    assert isinstance(weights, dict)
    tensors: dict[str, mx.array] = {}
    for key, value in weights.items():
        if key.endswith((".experts.gate_up_proj", ".experts.down_proj")):
            w = value.astype(mx.float32).swapaxes(-1, -2)  # (E, out, in): rows interleaved
            wq, scales = mx.quantize(w, group_size=32, bits=4, mode="mxfp4")[:2]
            e, rows, cols = w.shape
            tensors[f"{key}_blocks"] = wq.view(mx.uint8).reshape(e, rows, cols // 32, 16)
            tensors[f"{key}_scales"] = scales
        else:
            tensors[key] = value
    mx.save_safetensors(str(out / "model.safetensors"), tensors, metadata={"format": "pt"})
    config = normalize_config(json.loads((src / "config.json").read_text()))
    keep = [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ]
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": keep}
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out


def mlx_names(src: Path, out: Path) -> Path:
    """Write `src` (transformers layout, float) under mlx-lm's tensor names into `out`."""
    _copy_side(src, out)
    weights = mx.load(str(src / "model.safetensors"))
    assert isinstance(weights, dict)
    config = normalize_config(json.loads((src / "config.json").read_text()))
    renamed = family_for("gpt_oss").prepare_hf(dict(weights), config)
    mx.save_safetensors(str(out / "model.safetensors"), renamed, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out


# derived fixture forms: name -> (the fixture it is made from, the writer)
FORMS = {"gpt_oss_mxfp4": ("gpt_oss", hub_mxfp4)}
