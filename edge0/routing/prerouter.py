"""Prerouter heads: predict the next MoE layer's routing one decode step ahead."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from edge0.errors import CheckpointError, ModelLoadError
from edge0.routing.prerouter_config import (
    CONFIG_FILE,
    FILES,
    FORMAT_VERSION,
    HORIZONS,
    WEIGHTS_FILE,
    PrerouterConfig,
    default_hidden,
)
from edge0.routing.prerouter_heads import PrerouterHead, RouterCopyHead, multi_hot
from edge0.routing.router_access import (
    block_top_k,
    moe_blocks,
    router_bias,
    router_of,
    router_weight,
)

__all__ = [
    "CONFIG_FILE",
    "FILES",
    "FORMAT_VERSION",
    "HORIZONS",
    "WEIGHTS_FILE",
    "PrerouterConfig",
    "PrerouterHead",
    "PrerouterSet",
    "RouterCopyHead",
    "block_top_k",
    "default_hidden",
    "moe_blocks",
    "multi_hot",
    "router_bias",
    "router_of",
    "router_weight",
]


class PrerouterSet:
    """All heads of one model: `predict(layer, ...)` gives logits for the layer that follows it."""

    def __init__(self, config: PrerouterConfig, heads: dict[int, PrerouterHead]) -> None:
        self.config = config
        self.heads = heads  # owner layer -> head
        self.target = dict(config.heads())  # owner layer -> target layer

    # construction -------------------------------------------------------------------------

    @classmethod
    def from_model(
        cls,
        model: nn.Module,
        hidden: int | None = None,
        wrap: bool = True,
        lean: bool = False,
        horizon: str = "token",
    ) -> PrerouterSet:
        """Untrained heads: `l` copies the next MoE layer's router, fc2 is zero.

        `lean`: `RouterCopyHead`s (same logits, no zero parts) for inference only.
        horizon "layer": the same heads, targeting the next MoE layer at the same token (no
        wrap-around head); untrained, each is that next router on this layer's hidden.
        """
        if horizon not in HORIZONS:
            raise ValueError(f"horizon {horizon!r} is not one of {list(HORIZONS)}")
        blocks = moe_blocks(model)
        w0 = router_weight(blocks[0][1])
        num_experts, d_model = w0.shape
        biased = router_bias(blocks[0][1]) is not None
        config = PrerouterConfig(
            d_model=d_model,
            num_experts=num_experts,
            top_k=block_top_k(blocks[0][1]),
            hidden=hidden or default_hidden(d_model),
            moe_layers=tuple(i for i, _ in blocks),
            wrap=wrap and horizon == "token",
            horizon=horizon,
            router_bias=biased,
        )
        by_layer = dict(blocks)
        heads: dict[int, Any] = {}
        for owner, target in config.heads():
            head = (
                RouterCopyHead(d_model, num_experts, biased)
                if lean
                else PrerouterHead(d_model, num_experts, config.hidden, biased)
            )
            head.lin_h.weight = router_weight(by_layer[target])
            bias = router_bias(by_layer[target])
            if biased:  # untrained, the head is the target's router, bias included
                if bias is None:
                    raise ModelLoadError(
                        f"layer {target}'s router has no bias, layer {blocks[0][0]}'s has one; "
                        "re-convert the model"
                    )
                head.lin_h.bias = bias
            heads[owner] = head
        mx.eval([h.parameters() for h in heads.values()])
        return cls(config, heads)

    def layer_horizon(self) -> PrerouterSet:
        """Untrained layer-horizon heads from these untrained token heads: a layer head has
        the same target (the next MoE layer, at the same token instead of the next), so it
        starts from the same weights; no wrap-around head. The arrays are shared, and
        training either set replaces its own heads' arrays, not the other's."""
        if self.config.horizon != "token" or self.config.trained:
            raise ValueError("layer-horizon heads start from untrained token-horizon heads")
        c = self.config
        config = attrs.evolve(c, wrap=False, horizon="layer", info={})  # untrained, as c
        heads: dict[int, Any] = {}
        for owner, _ in config.heads():
            src = self.heads[owner]
            if isinstance(src, PrerouterHead):
                head: Any = PrerouterHead(c.d_model, c.num_experts, c.hidden, c.router_bias)
            else:
                head = RouterCopyHead(c.d_model, c.num_experts, c.router_bias)
            head.update(src.parameters())
            heads[owner] = head
        return PrerouterSet(config, heads)

    # inference ----------------------------------------------------------------------------

    def predict(
        self,
        layer: int,
        hidden: mx.array,
        topk_t: mx.array | None,
        topk_prev: mx.array | None,
    ) -> mx.array:
        """Logits (..., E) for layer `self.target[layer]` at token t+1 (t for horizon "layer").

        Args:
            layer: the owner layer N (a model layer index).
            hidden: (..., d_model) layer N's post-attention-norm hidden at token t.
            topk_t: (..., k) experts layer N executed at token t (any k).
            topk_prev: (..., k') experts layer N executed at t-1, or None at the first token.
        """
        head = self.heads.get(layer)
        if head is None:
            raise KeyError(f"no prerouter head for layer {layer}; heads: {sorted(self.heads)}")
        dtype = head.lin_h.weight.dtype
        if isinstance(head, RouterCopyHead):  # reads the hidden only: no multi-hot inputs built
            return head.lin_h(hidden if hidden.dtype == dtype else hidden.astype(dtype))
        lead = tuple(hidden.shape[:-1])
        e = self.config.num_experts
        return head(hidden.astype(dtype), multi_hot(topk_t, e, lead), multi_hot(topk_prev, e, lead))

    def predict_hots(self, layer: int, hidden: mx.array, hots: mx.array) -> mx.array:
        """`predict` with the multi-hot inputs given as one (..., 2E) float32 array (what
        `predict` concatenates from `multi_hot(topk_t)` and `multi_hot(topk_prev)`)."""
        head = self.heads.get(layer)
        if head is None:
            raise KeyError(f"no prerouter head for layer {layer}; heads: {sorted(self.heads)}")
        dtype = head.lin_h.weight.dtype
        if isinstance(head, RouterCopyHead):
            return head.lin_h(hidden if hidden.dtype == dtype else hidden.astype(dtype))
        return head.from_hots(hidden if hidden.dtype == dtype else hidden.astype(dtype), hots)

    def predict_topk(
        self,
        layer: int,
        hidden: mx.array,
        topk_t: mx.array | None,
        topk_prev: mx.array | None,
        k: int,
    ) -> mx.array:
        """(..., k) predicted expert indices for the target layer at t+1 (unordered)."""
        logits = self.predict(layer, hidden, topk_t, topk_prev)
        return mx.argpartition(-logits, kth=k - 1, axis=-1)[..., :k]

    # persistence --------------------------------------------------------------------------

    def parameters_flat(self) -> dict[str, mx.array]:
        flat: dict[str, mx.array] = {}
        for owner, head in self.heads.items():
            leaves: Any = tree_flatten(head.parameters())
            for name, value in leaves:
                flat[f"heads.{owner}.{name}"] = value
        return flat

    def save(self, model_dir: str | Path) -> Path:
        """Write the heads' two files into `model_dir` (FILES[horizon]); returns the weights."""
        d = Path(model_dir)
        d.mkdir(parents=True, exist_ok=True)
        wname, cname = FILES[self.config.horizon]
        mx.save_safetensors(str(d / wname), self.parameters_flat(), metadata={"format": "mlx"})
        (d / cname).write_text(json.dumps(self.config.to_json(), indent=2) + "\n")
        return d / wname

    @staticmethod
    def exists(model_dir: str | Path, horizon: str = "token") -> bool:
        d = Path(model_dir)
        wname, cname = FILES[horizon]
        return (d / wname).is_file() and (d / cname).is_file()

    @classmethod
    def load(cls, model_dir: str | Path, horizon: str = "token") -> PrerouterSet:
        """Read the heads of `horizon` from `model_dir`; CheckpointError naming the file on
        any mismatch."""
        d = Path(model_dir)
        wname, cname = FILES[horizon]
        wpath, cpath = d / wname, d / cname
        if not cls.exists(d, horizon):
            flag = "" if horizon == "token" else f" --horizon {horizon}"
            raise CheckpointError(
                f"{d}: no {wname} + {cname}; train heads with `edge0 train heads{flag}`"
            )
        try:
            config = PrerouterConfig.from_json(json.loads(cpath.read_text()))
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{cpath}: malformed ({exc}); retrain the heads") from exc
        if config.horizon != horizon:
            raise CheckpointError(
                f"{cpath}: holds {config.horizon!r}-horizon heads, expected {horizon!r}; "
                f"retrain with `edge0 train heads --horizon {horizon}`"
            )
        try:
            flat = mx.load(str(wpath))
            assert isinstance(flat, dict)
        except (RuntimeError, ValueError) as exc:
            raise CheckpointError(f"{wpath}: unreadable ({exc}); retrain the heads") from exc
        heads: dict[int, PrerouterHead] = {}
        for owner, _ in config.heads():
            head = PrerouterHead(
                config.d_model, config.num_experts, config.hidden, config.router_bias
            )
            prefix = f"heads.{owner}."
            items = [(k[len(prefix) :], v) for k, v in flat.items() if k.startswith(prefix)]
            try:
                head.load_weights(items, strict=True)
            except ValueError as exc:
                raise CheckpointError(f"{wpath}: head of layer {owner}: {exc}") from exc
            heads[owner] = head
        mx.eval([h.parameters() for h in heads.values()])
        return cls(config, heads)

    def check_model(self, model: nn.Module) -> None:
        """Raise CheckpointError when these heads do not fit `model`'s MoE layers."""
        blocks = moe_blocks(model)
        layers = tuple(i for i, _ in blocks)
        e, d = router_weight(blocks[0][1]).shape
        if layers != self.config.moe_layers or (e, d) != (
            self.config.num_experts,
            self.config.d_model,
        ):
            raise CheckpointError(
                f"{CONFIG_FILE}: heads are for MoE layers {list(self.config.moe_layers)}, "
                f"E={self.config.num_experts}, d={self.config.d_model}; the model has "
                f"{list(layers)}, E={e}, d={d}; retrain the heads for this model"
            )
        if self.config.router_bias != (router_bias(blocks[0][1]) is not None):
            raise CheckpointError(
                f"{CONFIG_FILE}: heads {'with' if self.config.router_bias else 'without'} the "
                "router's bias, the model's router "
                f"{'has none' if self.config.router_bias else 'has one'}; retrain the heads"
            )
