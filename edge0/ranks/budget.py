"""Per-rank `--memory-budget`: what each layer holds on its rank, and each rank's memory plan
(docs/distributed.md, "A memory budget per rank").
"""

from __future__ import annotations

import re
from pathlib import Path

import attrs

from edge0.errors import ConfigError
from edge0.families.base import LINEAR
from edge0.layout.manifest import Manifest
from edge0.layout.safetensors_io import MX_DTYPES, read_header
from edge0.options.engine import EngineOptions
from edge0.runtime.plan.footprint import footprint
from edge0.runtime.plan.memory import (
    Footprint,
    MemoryPlan,
    layer_kinds,
    layer_state_bytes,
    layers_kv_bytes,
    plan,
)
from edge0.runtime.setup.prepare import kept_layers

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_HEAD = re.compile(r"^heads\.(\d+)\.")


@attrs.frozen
class LayerBytes:
    """Bytes each layer holds on the rank that owns it, and the parts outside the layers.

    The one-process `Footprint` split by layer, from the file headers (nothing is loaded);
    `footprint` adds a rank's layers back up, for `rank_plan` to run the same
    `memory.plan` on, and `costs` is what the default `--layers` split balances.
    """

    fp: Footprint  # the one-process footprint (slot size, top-k, working memory, baseline)
    resident: tuple[int, ...]  # per layer: its resident tensors, as loaded
    experts: tuple[int, ...]  # per layer: all its experts when they stay resident
    heads: tuple[int, ...]  # per layer: the predictor head it owns
    kv: tuple[int, ...]  # per layer: KV cache (full attention) for the planned context
    state: tuple[int, ...]  # per layer: recurrent state (linear attention)
    streamed: tuple[bool, ...]  # per layer: its experts stream through the rank's slot pool
    embed: int  # the embedding: the first rank, and the last one when the head is tied to it
    head: int  # final norm and lm_head: the last rank
    tied: bool
    adapter: int  # a recovery LoRA adapter: every rank applies all of it while loading

    def costs(self) -> list[int]:
        """What the `--layers` split balances: each layer's fixed bytes, the embedding on the
        first layer, the head on the last (a rank's slot slack, baseline and working memory
        are the same on every rank and do not move the balance)."""
        slot = self.fp.top_k * self.fp.slot
        out = [
            r + e + h + kv + st + (slot if s else 0)
            for r, e, h, kv, st, s in zip(
                self.resident,
                self.experts,
                self.heads,
                self.kv,
                self.state,
                self.streamed,
                strict=True,
            )
        ]
        out[0] += self.embed
        out[-1] += self.head + (self.embed if self.tied and len(out) > 1 else 0)
        return out

    def footprint(self, own: range, first: bool, last: bool) -> Footprint:
        """The Footprint of a rank owning layers `own` (first / last rank of the pipeline)."""
        embed = self.embed if first or (last and self.tied) else 0
        return attrs.evolve(
            self.fp,
            resident=self.adapter
            + sum(self.resident[i] for i in own)
            + embed
            + (self.head if last else 0),
            resident_experts=sum(self.experts[i] for i in own),
            heads=sum(self.heads[i] for i in own),
            layers=sum(1 for i in own if self.streamed[i]),
            kv=sum(self.kv[i] for i in own),
            state=sum(self.state[i] for i in own),
            load=self.fp.load if any(self.experts[i] for i in own) else 0,
        )


def layer_bytes(path: Path, manifest: Manifest, opts: EngineOptions, baseline: int) -> LayerBytes:
    """Split the one-process footprint of `opts` by layer (from the headers)."""
    from edge0.layout.load import resident_tensor_bytes
    from edge0.model.loaded import activation_dtype
    from edge0.routing.prerouter import PrerouterSet

    fp = footprint(path, manifest, opts, baseline)
    text = manifest.config.get("text_config") or manifest.config
    n = int(text["num_hidden_layers"])
    dtype = activation_dtype(MX_DTYPES[manifest.float_dtype])
    resident, embed, head = [0] * n, 0, 0
    tensors = resident_tensor_bytes(path, manifest, dtype)
    for name, nbytes in tensors.items():
        m = _LAYER.search(name)
        if m is not None and int(m.group(1)) < n:
            resident[int(m.group(1))] += nbytes
        elif "embed" in name:
            embed += nbytes
        else:  # final norm, lm_head
            head += nbytes
    moe = list(manifest.moe_layers)
    kept = moe if opts.mode == "resident" else kept_layers(moe, opts)
    experts = [fp.resident_experts // len(kept) if i in kept else 0 for i in range(n)]
    heads = [0] * n
    if fp.heads:
        predictor = opts.predictor or ("heads" if PrerouterSet.exists(path) else "init")
        if predictor == "heads":
            from edge0.routing.prerouter import WEIGHTS_FILE

            for name, info in read_header(path / WEIGHTS_FILE).items():
                m = _HEAD.match(name)
                if m is not None:
                    heads[int(m.group(1))] += info.nbytes
        else:  # untrained router copies, one per head owner (footprint's `owners`)
            owners = moe[:-1] + (moe[-1:] if opts.first_layer == "wrap" else [])
            for i in owners:
                heads[i] = fp.heads // len(owners)
    kinds = layer_kinds(manifest.config)
    per_state = layer_state_bytes(manifest.config)
    streamed = tuple(opts.mode != "resident" and i in moe and i not in kept for i in range(n))
    tied = bool(text.get("tie_word_embeddings", manifest.config.get("tie_word_embeddings")))
    return LayerBytes(
        fp,
        tuple(resident),
        tuple(experts),
        tuple(heads),
        tuple(layers_kv_bytes(manifest.config, opts.context)),
        tuple(per_state if k == LINEAR else 0 for k in kinds),
        streamed,
        embed,
        head,
        tied,
        fp.resident - sum(tensors.values()),
    )


def rank_plan(
    budget: str | int, lb: LayerBytes, ranges: tuple[range, ...], rank: int
) -> MemoryPlan:
    """Rank `rank`'s memory plan; ConfigError naming the rank, its layers and the fix."""
    own = ranges[rank]
    fp = lb.footprint(own, rank == 0, rank == len(ranges) - 1)
    try:
        return plan(budget, attrs.evolve(fp, layer_experts=0))  # no more layers resident
    except ConfigError as exc:
        raise ConfigError(
            f"rank {rank} (layers {own.start}-{own.stop - 1}): {exc}, or give rank {rank} "
            "fewer layers with --layers"
        ) from None
