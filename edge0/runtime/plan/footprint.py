"""What a run will hold, from the files' headers (nothing is loaded): the memory plan's input."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edge0.layout.manifest import Manifest
from edge0.model.loaded import activation_dtype
from edge0.options.engine import EngineOptions
from edge0.routing.prerouter import PrerouterSet
from edge0.runtime.io.slotmem import ALIGN, slot_bytes
from edge0.runtime.plan.memory import (
    Footprint,
    head_bytes,
    kv_bytes,
    load_bytes,
    state_bytes,
    working_bytes,
)
from edge0.runtime.prefill.memory import chunk_bytes_per_token, chunk_fixed_bytes


def batch_k(top_k: int, max_batch: int, n_experts: int) -> int:
    """Experts a layer may need in one step: the union of `max_batch` rows' sets."""
    return min(n_experts, top_k * max_batch)


def footprint(path: Path, manifest: Manifest, opts: EngineOptions, baseline: int) -> Footprint:
    """What a run with `opts` will hold, from the files' headers (nothing is loaded)."""
    from edge0.layout.load import expert_dtypes, resident_bytes
    from edge0.layout.safetensors_io import MX_DTYPES

    text = manifest.config.get("text_config") or manifest.config
    dtype = activation_dtype(MX_DTYPES[manifest.float_dtype])
    k = opts.top_k or int(text["num_experts_per_tok"])
    moe = list(manifest.moe_layers)
    kept_as = expert_dtypes(path, manifest, dtype)  # a resident stack's and a slot's fields
    expert = sum(int(np.prod(f.shape)) * kept_as[f.name].size for f in manifest.fields)
    resident = resident_bytes(path, manifest, dtype) + _adapter_bytes(path, opts)
    chunk = (
        chunk_fixed_bytes(manifest.config),
        chunk_bytes_per_token(manifest.config, k, opts.context),
    )
    load = load_bytes(manifest, kept_as)
    if opts.mode == "resident":
        return Footprint(
            resident,
            len(moe) * manifest.n_experts * expert,
            0,
            0,
            0,
            0,
            k,
            opts.max_batch * kv_bytes(manifest.config, opts.context),
            opts.max_batch * state_bytes(manifest.config),
            working_bytes(manifest.config, opts.context),
            baseline,
            *chunk,
            load,
            context=opts.context,
            prompt_k=k,
        )
    kept = 1 if opts.first_layer == "resident" and len(moe) > 1 else 0
    predictor = opts.predictor or ("heads" if PrerouterSet.exists(path) else "init")
    owners = len(moe) - 1 + int(opts.first_layer == "wrap")
    heads = head_bytes(path, manifest, predictor, owners) if opts.mode in ("hint", "route") else 0
    b = opts.max_batch  # the union of b rows' sets per layer; a KV cache and state per row
    return Footprint(
        resident,
        kept * manifest.n_experts * expert,
        heads,
        slot_bytes(manifest, 1, kept_as) - ALIGN,
        manifest.record_size,
        len(moe) - kept,
        batch_k(k, b, manifest.n_experts),
        b * kv_bytes(manifest.config, opts.context),
        b * state_bytes(manifest.config),
        working_bytes(manifest.config, opts.context),
        baseline,
        *chunk,
        load if kept else 0,
        manifest.n_experts,
        context=opts.context,
        prompt_k=k,
        layer_experts=manifest.n_experts * expert,  # what one more resident layer holds
        layer_load=load,
    )


def _adapter_bytes(path: Path, opts: EngineOptions) -> int:
    from edge0.layout.safetensors_io import read_header
    from edge0.model.lora import ADAPTER_DIR, WEIGHTS_FILE

    file = path / ADAPTER_DIR / WEIGHTS_FILE
    if not opts.adapter or not file.is_file():
        return 0
    return sum(
        int(np.prod(v.shape, dtype=np.int64)) * v.itemsize for v in read_header(file).values()
    )
