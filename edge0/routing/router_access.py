"""A model's sparse blocks as the prerouter sees them: which layers, their routers, their top-k."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from edge0.errors import ModelLoadError


def router_weight(block: nn.Module) -> mx.array:
    """The (E, d) router weight of a sparse block, dequantized when the router is quantized."""
    gate = router_of(block)
    if isinstance(gate, nn.QuantizedLinear):
        from edge0.model.loaded import activation_dtype

        wide = activation_dtype(gate.scales.dtype)  # scales may be kept narrower (layout.load)
        biases = gate.get("biases")
        return mx.dequantize(
            gate.weight,
            gate.scales.astype(wide),
            biases.astype(wide) if biases is not None else None,
            gate.group_size,
            gate.bits,
            mode=gate.mode,
        ).astype(mx.float32)
    return gate.weight.astype(mx.float32)


def router_bias(block: nn.Module) -> mx.array | None:
    """The (E,) bias of a sparse block's router, None when it has none."""
    gate = router_of(block)
    bias = gate.get("bias") if "bias" in gate else None
    return None if bias is None else bias.astype(mx.float32)


def router_of(block: nn.Module) -> nn.Module:
    """The router linear of a sparse block (a family's `router_attr`: `gate`, `router`, ...)."""
    from edge0.families import FAMILIES
    from edge0.families.base import router_at

    paths = sorted({f.router_attr for f in FAMILIES.values()}, key=lambda a: -a.count("."))
    for attr in paths:  # the deepest first: `router.layer` before `router`
        try:
            return router_at(block, attr)
        except KeyError:
            continue
    raise ModelLoadError(f"sparse block {type(block).__name__} has no router")


def moe_blocks(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """(layer index, sparse block) for each decoder layer with a router and routed experts
    (in the model, or streamed by Edge0's block)."""
    from edge0.families import for_model
    from edge0.model.sparse import SPARSE_ATTRS

    fam = for_model(model)
    out = []
    for i, layer in enumerate(model.layers):
        for attr in SPARSE_ATTRS:
            block = getattr(layer, attr, None) if attr in layer else None
            router = fam.router_attr.split(".")[0]
            streamed = hasattr(block, "stream")  # a streaming block: its experts in slots
            if block is not None and router in block and (fam.switch_attr in block or streamed):
                out.append((i, block))
    if not out:
        raise ModelLoadError("model has no sparse MoE layers (no router gate); not a MoE model")
    return out


def block_top_k(block: nn.Module) -> int:
    """The top-k of a sparse block, or of its router where the router keeps it."""
    k = None
    for owner in (block, *(block[a] for a in ("router", "gate") if a in block)):
        k = k or getattr(owner, "top_k", None) or getattr(owner, "num_experts_per_tok", None)
    if not isinstance(k, int):
        raise ModelLoadError(f"sparse block {type(block).__name__} has no top_k attribute")
    return k
