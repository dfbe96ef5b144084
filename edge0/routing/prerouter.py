"""Prerouter heads: predict the next MoE layer's routing one decode step ahead (DESIGN.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from edge0.errors import CheckpointError, ModelLoadError

WEIGHTS_FILE = "prerouter.safetensors"
CONFIG_FILE = "prerouter.json"
FORMAT_VERSION = 1
# Horizon of a set of heads: "token" (the next MoE layer at token t+1, what route mode runs
# on) or "layer" (the next MoE layer at the same token t: one layer of lead time). Each
# horizon has its own files, so layer heads never replace the shipped token heads.
HORIZONS = ("token", "layer")
FILES = {
    "token": (WEIGHTS_FILE, CONFIG_FILE),
    "layer": ("prerouter-layer.safetensors", "prerouter-layer.json"),
}


@attrs.frozen
class PrerouterConfig:
    """Shape and provenance of a set of heads (stored as prerouter.json)."""

    d_model: int
    num_experts: int
    top_k: int  # the model's own top-k
    hidden: int  # width of fc1 (paper: 512 for d_model 2048)
    moe_layers: tuple[int, ...]  # model layer indices with a sparse block, ascending
    wrap: bool = True  # the last MoE layer's head predicts the first MoE layer at t+1
    trained: bool = False
    horizon: str = "token"  # one of HORIZONS; "layer" heads never wrap
    info: dict[str, Any] = attrs.field(factory=dict)  # training provenance and figures

    def heads(self) -> list[tuple[int, int]]:
        """(owner layer N, target layer) pairs; the target is routed at token t+1 (horizon
        "token") or at the same token t (horizon "layer")."""
        pairs = list(zip(self.moe_layers[:-1], self.moe_layers[1:], strict=True))
        if self.wrap and self.moe_layers:
            pairs.append((self.moe_layers[-1], self.moe_layers[0]))
        return pairs

    def to_json(self) -> dict[str, Any]:
        d = attrs.asdict(self)
        d["moe_layers"] = list(self.moe_layers)
        d["format_version"] = FORMAT_VERSION
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PrerouterConfig:
        d = dict(d)
        version = d.pop("format_version", None)
        if version != FORMAT_VERSION:
            raise CheckpointError(
                f"{CONFIG_FILE}: format_version {version!r} is not {FORMAT_VERSION}; "
                "retrain the heads with `edge0 train heads`"
            )
        d["moe_layers"] = tuple(d["moe_layers"])
        horizon = d.get("horizon", "token")
        if horizon not in HORIZONS or (horizon == "layer" and d.get("wrap", True)):
            raise CheckpointError(
                f"{CONFIG_FILE}: horizon {horizon!r} (wrap {d.get('wrap', True)}) is not one of "
                f"{list(HORIZONS)} (layer heads do not wrap); retrain the heads"
            )
        return cls(**d)


def default_hidden(d_model: int) -> int:
    """Paper ratio (512 for d_model 2048), at least 32."""
    return max(32, d_model // 4)


def multi_hot(indices: mx.array | None, num_experts: int, lead: tuple[int, ...]) -> mx.array:
    """(..., k) expert indices -> (..., E) float32 multi-hot; None -> zeros of shape lead + (E,)."""
    if indices is None:
        return mx.zeros((*lead, num_experts), dtype=mx.float32)
    onehots = indices[..., None] == mx.arange(num_experts)  # (..., k, E)
    return mx.any(onehots, axis=-2).astype(mx.float32)


class PrerouterHead(nn.Module):
    """head(x) = fc2(gelu_erf(fc1(x))) + l(x), x = [hidden, multi-hot(t), multi-hot(t-1)].

    `l` is split into `lin_h` (the hidden columns, initialised to the next router) and
    `lin_m` (the multi-hot columns, zeros), so the untrained head is bit-exactly the
    next layer's router applied to this layer's hidden.
    """

    def __init__(self, d_model: int, num_experts: int, hidden: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        in_dim = d_model + 2 * num_experts
        self.fc1 = nn.Linear(in_dim, hidden)
        self.fc2 = nn.Linear(hidden, num_experts)
        self.lin_h = nn.Linear(d_model, num_experts, bias=False)
        self.lin_m = nn.Linear(2 * num_experts, num_experts, bias=False)
        self.fc2.weight = mx.zeros_like(self.fc2.weight)
        self.fc2.bias = mx.zeros_like(self.fc2.bias)
        self.lin_m.weight = mx.zeros_like(self.lin_m.weight)

    def __call__(self, hidden: mx.array, hot_t: mx.array, hot_prev: mx.array) -> mx.array:
        # hidden (..., d), hot_t / hot_prev (..., E) -> logits (..., E)
        hots = mx.concatenate([hot_t, hot_prev], axis=-1)  # (..., 2E)
        x = mx.concatenate([hidden, hots], axis=-1)  # (..., d + 2E)
        mlp = self.fc2(nn.gelu(self.fc1(x)))  # nn.gelu is the erf form
        return self.lin_h(hidden) + self.lin_m(hots) + mlp


class RouterCopyHead(nn.Module):
    """An untrained head without its zero parts: `lin_h(hidden)` alone.

    An untrained `PrerouterHead` adds `lin_m(hots)` and `fc2(...)`, whose weights
    are zeros, so its logits equal `lin_h(hidden)`; this keeps the same logits
    without the (d + 2E) x hidden fc1 that never contributes (5 of the 8 MiB of a
    head on the 35B shape). For inference with the `init` predictor; training
    starts from full `PrerouterHead`s.
    """

    def __init__(self, d_model: int, num_experts: int) -> None:
        super().__init__()
        self.lin_h = nn.Linear(d_model, num_experts, bias=False)

    def __call__(self, hidden: mx.array, hot_t: mx.array, hot_prev: mx.array) -> mx.array:
        return self.lin_h(hidden)


def router_weight(block: nn.Module) -> mx.array:
    """The (E, d) router weight of a sparse block, dequantized when the router is quantized."""
    gate = router_of(block)
    if isinstance(gate, nn.QuantizedLinear):
        from edge0.model.loaded import activation_dtype

        wide = activation_dtype(gate.scales.dtype)  # scales may be kept narrower (layout.load)
        biases = gate.get("biases")
        return mx.dequantize(
            gate.weight, gate.scales.astype(wide),
            biases.astype(wide) if biases is not None else None, gate.group_size, gate.bits,
            mode=gate.mode,
        ).astype(mx.float32)  # fmt: skip
    return gate.weight.astype(mx.float32)


def router_of(block: nn.Module) -> nn.Module:
    """The router linear of a sparse block (a family's `router_attr`: `gate`, `router`, ...)."""
    from edge0.routing.families import FAMILIES
    from edge0.routing.families.base import router_at

    paths = sorted({f.router_attr for f in FAMILIES.values()}, key=lambda a: -a.count("."))
    for attr in paths:  # the deepest first: granitemoe's `router.layer` before gpt-oss' `router`
        try:
            return router_at(block, attr)
        except KeyError:
            continue
    raise ModelLoadError(f"sparse block {type(block).__name__} has no router")


def moe_blocks(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """(layer index, sparse block) for each decoder layer with a router and routed experts."""
    from edge0.model.sparse import SPARSE_ATTRS
    from edge0.routing.families import for_model

    fam = for_model(model)
    out = []
    for i, layer in enumerate(model.layers):
        for attr in SPARSE_ATTRS:
            block = getattr(layer, attr, None) if attr in layer else None
            router = fam.router_attr.split(".")[0]
            if block is not None and router in block and fam.switch_attr in block:
                out.append((i, block))
    if not out:
        raise ModelLoadError("model has no sparse MoE layers (no router gate); not a MoE model")
    return out


def block_top_k(block: nn.Module) -> int:
    """The top-k of a sparse block, or of its router where the router keeps it (granitemoe)."""
    k = None
    for owner in (block, *(block[a] for a in ("router", "gate") if a in block)):
        k = k or getattr(owner, "top_k", None) or getattr(owner, "num_experts_per_tok", None)
    if not isinstance(k, int):
        raise ModelLoadError(f"sparse block {type(block).__name__} has no top_k attribute")
    return k


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
        config = PrerouterConfig(
            d_model=d_model,
            num_experts=num_experts,
            top_k=block_top_k(blocks[0][1]),
            hidden=hidden or default_hidden(d_model),
            moe_layers=tuple(i for i, _ in blocks),
            wrap=wrap and horizon == "token",
            horizon=horizon,
        )
        by_layer = dict(blocks)
        heads: dict[int, Any] = {}
        for owner, target in config.heads():
            head = (
                RouterCopyHead(d_model, num_experts) if lean
                else PrerouterHead(d_model, num_experts, config.hidden)
            )  # fmt: skip
            head.lin_h.weight = router_weight(by_layer[target])
            heads[owner] = head
        mx.eval([h.parameters() for h in heads.values()])
        return cls(config, heads)

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
            head = PrerouterHead(config.d_model, config.num_experts, config.hidden)
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
