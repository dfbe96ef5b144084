"""`--memory-budget`: the memory plan, made from file headers before anything is loaded
(docs/memory.md, "The plan").
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from edge0.errors import ConfigError
from edge0.families import family_for
from edge0.families.base import LINEAR
from edge0.layout.manifest import Manifest
from edge0.runtime.io.slotmem import ALIGN, POOL_LIMIT
from edge0.runtime.plan.chunk import choose
from edge0.storage.spec import TierStage, format_spec, parse_size, parse_spec

_MIB = 1 << 20
KV_STEP = 256  # mlx-lm's KVCache grows in steps of this many tokens
# decode working memory (MLX buffer cache, per-step temporaries, interpreter growth), measured
# with tools/memprobe.py: 14 / 28 / 52 MiB at d_model 512 / 1024 / 2048, the same at K=2, 4, 8
WORKING_BASE = 16 * _MIB
WORKING_PER_1K_D = 24 * _MIB


@attrs.frozen
class Footprint:
    """What a run will hold, from the files (bytes)."""

    resident: int
    resident_experts: int
    heads: int
    slot: int  # one slot: a record and its float32 sidecar where MLX computes the experts
    record: int  # one record as read
    layers: int  # streamed MoE layers
    top_k: int
    kv: int
    state: int
    working: int
    overhead: int
    chunk_fixed: int = 0  # a prompt chunk's memory whatever its length (prefill.memory)
    chunk_token: int = 0  # ... and per chunk token
    load: int = 0  # the transient of loading resident experts (load_bytes)
    experts: int = 0  # experts a streamed layer has (0: unknown, nothing is capped)
    context: int = 0  # tokens the KV cache is planned for (0: unknown): no chunk is longer
    prompt_k: int = 0  # experts a prompt token routes to (0: top_k)
    layer_experts: int = 0  # one streamed layer's experts loaded resident (0: none can be)
    layer_load: int = 0  # ... and the transient of loading them (load_bytes)

    @property
    def max_slots(self) -> int | None:
        """No more slots than the streamed records (they could never all be used) nor than
        a pool MLX can address (`POOL_LIMIT`); None: no cap."""
        caps = [(POOL_LIMIT - ALIGN) // self.slot] if self.slot else []
        if self.experts:
            caps.append(self.layers * self.experts)
        return min(caps) if caps else None

    @property
    def store(self) -> int | None:
        """The bytes of every streamed record: a RAM cache above it holds nothing more."""
        return self.layers * self.experts * self.record if self.experts else None

    @property
    def min_slots(self) -> int:
        from edge0.runtime.io.slots import pool_size

        return pool_size(self.top_k, self.layers) if self.layers else 0


@attrs.frozen
class MemoryPlan:
    budget: int
    resident: int  # resident weights, plus resident experts
    slots: int  # slot pool bytes
    kv: int  # KV cache and recurrent state
    cache: int  # bytes of the RAM cache tier (0: none)
    overhead: int = 0  # process RSS before the model was loaded
    working: int = 0  # decode working memory
    heads: int = 0  # predictor heads
    n_slots: int = 0
    extra_slots: int = 0  # slots bought with what the budget left
    choice: str = ""  # where the remainder went, and why
    prompt: int = 0  # a prompt chunk's working memory
    prefill_chunk: int = 1  # prompt tokens per forward that `prompt` holds
    load: int = 0  # loading resident experts: the transient (load_bytes)
    chunk_note: str = ""  # what the chosen prompt chunk trades (plan.chunk.choose)
    resident_layers: int = 0  # streamed MoE layers made resident with what the pool left

    @property
    def spent(self) -> int:
        """The bytes of every part the plan counts."""
        parts = (self.resident, self.heads, self.slots, self.kv, self.overhead, self.working)
        return sum(parts) + self.load + self.prompt + self.cache

    def line(self) -> str:
        return (
            f"memory budget {self.budget / _MIB:.0f} MiB = resident {self.resident / _MIB:.0f} + "
            f"heads {self.heads / _MIB:.0f} + slots {self.slots / _MIB:.0f} "
            f"({self.n_slots} slots) + KV {self.kv / _MIB:.0f} + "
            f"process {self.overhead / _MIB:.0f} + working {self.working / _MIB:.0f} + "
            f"loading {self.load / _MIB:.0f} + "
            f"prompt chunk {self.prompt / _MIB:.0f} ({self.prefill_chunk} tokens) + "
            f"RAM cache {self.cache / _MIB:.0f} MiB; {self.choice}"
            + (f"; {self.chunk_note}" if self.chunk_note else "")
        )


def to_bytes(value: str | int, flag: str = "--memory-budget") -> int:
    if isinstance(value, int):
        return value
    try:
        return parse_size(value)
    except ValueError as exc:
        raise ConfigError(f"{flag}: {exc}") from None


def plan(
    budget: str | int, fp: Footprint, chunk: int | None = None, cache: int | None = None
) -> MemoryPlan:
    """Split `budget`; ConfigError naming the parts when it cannot hold the fixed ones.

    `chunk`: the asked-for `--prefill-chunk` (ConfigError when it cannot fit what the
    fixed parts leave); None: the plan chooses one (`prompt_chunk`). `cache`: a RAM
    cache size the tier spec gives (`given_cache`): kept, or ConfigError when it cannot
    fit; None: the plan chooses. What the slot pool leaves at its cap makes whole
    streamed layers resident (`more_resident`).
    """
    made = _plan(budget, fp, chunk, cache)
    n = 0 if cache is not None else more_resident(fp, made)  # a sized RAM cache is kept as is
    if not n:
        return made
    again = _plan(made.budget, with_resident(fp, n), made.prefill_chunk)
    first = fp.resident_experts // fp.layer_experts  # --first-layer resident's layer
    which = f"MoE layer {first}" if n == 1 else f"MoE layers {first}-{first + n - 1}"
    why = (
        f"every streamed MoE layer fits resident ({which}"
        if n == fp.layers
        else f"the slot pool at its cap ({made.n_slots} slots), {n} more MoE layers are "
        f"resident ({which}, the first streamed ones"
    ) + f": {fp.layer_experts / _MIB:.0f} MiB of experts each, loaded whole; no slots, no reads)"
    return attrs.evolve(
        again, choice=f"{why}; {again.choice}", chunk_note=made.chunk_note, resident_layers=n
    )


def with_resident(fp: Footprint, n: int) -> Footprint:
    """`fp` with its first `n` streamed layers' experts resident instead."""
    return attrs.evolve(
        fp,
        layers=fp.layers - n,
        resident_experts=fp.resident_experts + n * fp.layer_experts,
        load=max(fp.load, fp.layer_load),
    )


def more_resident(fp: Footprint, made: MemoryPlan) -> int:
    """How many streamed layers to make resident: the most `n` whose experts (and, for the
    first, their load transient) fit in what the pool leaves once it holds the most slots
    it can for the other layers (`Footprint.max_slots`: 8 GiB, or one slot per record).
    The remainder buys slots first (docs/memory.md, "Resident layers under a large budget")."""
    if not fp.layers or not fp.layer_experts or fp.max_slots is None:
        return 0
    left = made.budget - made.spent + made.extra_slots * fp.slot  # after fixed parts (n = 0)
    best = 0
    for n in range(1, fp.layers + 1):
        fp_n = with_resident(fp, n)
        cap = fp_n.max_slots or 0
        freed = (fp.min_slots - fp_n.min_slots) * fp.slot  # the fewer slots the rule asks
        left_n = left - n * fp.layer_experts - (fp_n.load - fp.load) + freed
        if left_n >= max(0, cap - fp_n.min_slots) * fp.slot:
            best = n
    return best


def _plan(
    budget: str | int, fp: Footprint, chunk: int | None = None, cache: int | None = None
) -> MemoryPlan:
    total = to_bytes(budget)
    n_min = fp.min_slots
    kv = fp.kv + fp.state
    resident = fp.resident + fp.resident_experts
    fixed = resident + fp.heads + n_min * fp.slot + ALIGN + kv + fp.overhead + fp.working + fp.load
    left = total - fixed
    if left < 0:
        raise ConfigError(
            f"--memory-budget {total / _MIB:.0f} MiB is below the {fixed / _MIB:.0f} MiB that "
            f"resident weights ({resident / _MIB:.0f}), predictor heads ({fp.heads / _MIB:.0f}), "
            f"the slot pool ({n_min} slots, {n_min * fp.slot / _MIB:.0f}), KV cache and state "
            f"({kv / _MIB:.0f}), process ({fp.overhead / _MIB:.0f}), decode working memory "
            f"({fp.working / _MIB:.0f}) and loading ({fp.load / _MIB:.0f}) need; raise the "
            f"budget, lower --top-k or the context"
        )
    tokens, prompt, note = prompt_chunk(total, left, fp, chunk)
    left -= prompt
    if cache is not None and fp.layers:
        made = _with_cache(total, fp, n_min, kv, resident, tokens, prompt, left, cache)
        return attrs.evolve(made, chunk_note=note)
    extra, cache = 0, 0
    if not fp.layers:
        choice = "nothing is streamed: the rest is unused"
    else:  # free slots keep their experts: a cache with no copy (docs/memory.md)
        extra = _capped(fp, n_min, left // fp.slot)
        choice = (
            f"the {left / _MIB:.0f} MiB left buy {extra} more slots (they keep their experts "
            f"with no copy; a RAM cache only where --tiers gives its size)"
        )
        choice += _unspent(fp, left - extra * fp.slot)
    n = n_min + extra
    return MemoryPlan(
        total,
        resident,
        n * fp.slot + ALIGN if n else 0,
        kv,
        cache,
        fp.overhead,
        fp.working,
        fp.heads,
        n,
        extra,
        choice,
        prompt,
        tokens,
        fp.load,
        note,
    )


def _with_cache(
    total: int,
    fp: Footprint,
    n_min: int,
    kv: int,
    resident: int,
    tokens: int,
    prompt: int,
    left: int,
    cache: int,
) -> MemoryPlan:
    """The plan when --tiers names the RAM cache's size: it is kept, the rest buys slots."""
    if cache > left:
        raise ConfigError(
            f"--tiers asks for a {cache / _MIB:.0f} MiB RAM cache but --memory-budget "
            f"{total / _MIB:.0f} MiB leaves {max(left, 0) / _MIB:.0f} MiB after the fixed parts; "
            f"give ram:{max(left, 0) // _MIB}MiB or less, write `ram` without a size to let the "
            "plan choose, or raise the budget"
        )
    extra = _capped(fp, n_min, (left - cache) // fp.slot)
    choice = (
        f"the RAM cache keeps its {cache / _MIB:.0f} MiB from --tiers; the "
        f"{(left - cache) / _MIB:.0f} MiB left buy {extra} more slots"
    )
    choice += _unspent(fp, left - cache - extra * fp.slot)
    n = n_min + extra
    return MemoryPlan(
        total,
        resident,
        n * fp.slot + ALIGN,
        kv,
        cache,
        fp.overhead,
        fp.working,
        fp.heads,
        n,
        extra,
        choice,
        prompt,
        tokens,
        fp.load,
    )


def _capped(fp: Footprint, n_min: int, extra: int) -> int:
    """`extra` slots, fewer where the pool would pass the number of streamed records."""
    cap = fp.max_slots
    return extra if cap is None else max(0, min(extra, cap - n_min))


def _unspent(fp: Footprint, spare: int) -> str:
    """What the plan says of budget it could not use (the pool is at its cap)."""
    if spare < max(_MIB, fp.slot) or fp.max_slots is None:  # less than a slot: not the cap
        return ""
    if fp.store is not None and fp.max_slots == fp.layers * fp.experts:
        return (
            f"; {spare / _MIB:.0f} MiB left unspent: the {fp.layers * fp.experts} streamed "
            f"records ({fp.store / _MIB:.0f} MiB) all fit"
        )
    return (
        f"; {spare / _MIB:.0f} MiB left unspent: a slot pool holds at most "
        f"{POOL_LIMIT / 2**30:.0f} GiB (MLX's int32 dimensions)"
    )


def given_cache(spec: str) -> int | None:
    """The RAM cache size a tier spec states (`ram:512MiB`, `ram:budget=1GiB`); None when
    the spec has no `ram` stage or one without a size (the plan then chooses)."""
    for stage in parse_spec(spec):
        if stage.name == "ram":
            text = (
                stage.positional
                if stage.positional is not None
                else dict(stage.options).get("budget")
            )
            return None if text is None else to_bytes(text, "--tiers ram")
    return None


def chunk_cost(fp: Footprint, tokens: int) -> int:
    """Bytes a prompt chunk of `tokens` holds (0 for one token: decode's working memory)."""
    return 0 if tokens <= 1 else fp.chunk_fixed + tokens * fp.chunk_token


def prompt_chunk(total: int, left: int, fp: Footprint, chunk: int | None) -> tuple[int, int, str]:
    """(tokens, bytes, what it trades) of the prompt chunk: the asked one if it fits in `left`,
    else an error; unasked, `plan.chunk.choose`'s (its share of `left`, its reads' saving)."""
    if chunk is not None:
        need = chunk_cost(fp, chunk)
        if need > left:
            fit = max(1, (left - fp.chunk_fixed) // fp.chunk_token) if fp.chunk_token else 1
            raise ConfigError(
                f"--prefill-chunk {chunk} needs {need / _MIB:.0f} MiB but --memory-budget "
                f"{total / _MIB:.0f} MiB leaves {left / _MIB:.0f} MiB after the fixed parts; "
                f"use --prefill-chunk {fit} or less, or raise the budget"
            )
        return chunk, need, ""
    k = fp.prompt_k or fp.top_k
    got = choose(left, fp.chunk_fixed, fp.chunk_token, fp.experts, k, fp.context)
    return got.tokens, got.bytes, got.note


def _text(config: dict[str, Any]) -> dict[str, Any]:
    c: dict[str, Any] = config.get("text_config") or config
    return c


def layer_kinds(config: dict[str, Any]) -> list[str]:
    """Each decoder layer's attention, as its family says (`full_attention`, ...)."""
    return family_for(str(config["model_type"])).layer_kinds(_text(config))


def attention_layers(config: dict[str, Any]) -> int:
    """Layers whose KV cache grows with the context (attention without a window)."""
    family, c = family_for(str(config["model_type"])), _text(config)
    kinds, windows = layer_kinds(config), family.windows(c)
    return sum(k != LINEAR and w is None for k, w in zip(kinds, windows, strict=True))


def layers_kv_bytes(config: dict[str, Any], context: int, itemsize: int = 4) -> list[int]:
    """Each decoder layer's KV cache at `context` tokens, rounded up to mlx-lm's growth step:
    a windowed layer's holds at most its window plus one step (a prompt chunk's tokens join
    before the oldest go), a linear-attention layer none."""
    family, c = family_for(str(config["model_type"])), _text(config)
    tokens = -(-context // KV_STEP) * KV_STEP
    per_token = family.kv_token_bytes(c, itemsize)
    return [
        0 if kind == LINEAR else per_token * (tokens if w is None else min(tokens, w + KV_STEP))
        for kind, w in zip(layer_kinds(config), family.windows(c), strict=True)
    ]


def kv_bytes(config: dict[str, Any], context: int, itemsize: int = 4) -> int:
    """KV cache of `context` tokens (rounded up to mlx-lm's growth step), every layer's."""
    return sum(layers_kv_bytes(config, context, itemsize))


def layer_state_bytes(config: dict[str, Any], itemsize: int = 4) -> int:
    """One linear-attention layer's recurrent state, as its family says."""
    return family_for(str(config["model_type"])).state_layer_bytes(_text(config), itemsize)


def state_bytes(config: dict[str, Any], itemsize: int = 4) -> int:
    """Recurrent state of the linear-attention layers (conv state and delta-rule state)."""
    n = layer_kinds(config).count(LINEAR)
    return n * layer_state_bytes(config, itemsize) if n else 0


def working_bytes(config: dict[str, Any], context: int) -> int:
    """Decode working memory: the measured model (docs/memory.md), plus the largest layer's
    KV cache (mlx-lm grows a layer's cache by concatenation: old and new alive at once)."""
    d = int(_text(config).get("hidden_size", 1024))
    kv = max(layers_kv_bytes(config, context), default=0)
    return WORKING_BASE + WORKING_PER_1K_D * d // 1024 + kv


def load_bytes(manifest: Manifest, dtypes: Mapping[str, Any]) -> int:
    """The transient of loading one layer's experts resident (0 when none is): the record
    buffer they are read through, and the largest float field's (E, ...) stack in its
    stored dtype while its copy in the wider dtype `dtypes` holds it in is made (one field
    at a time; fields kept as stored add nothing). Measured on a 20B MXFP4 shape: reading
    the layer through a numpy copy held it twice (404 MiB over the steady state),
    docs/memory.md."""
    from edge0.layout.records import VIEW_DTYPES

    widest = 0
    for f in manifest.fields:
        size = np.dtype(VIEW_DTYPES[f.dtype]).itemsize
        if f.dtype in ("bfloat16", "float16") and size < dtypes[f.name].size:
            widest = max(widest, int(np.prod(f.shape, dtype=np.int64)) * size)
    return manifest.record_size + manifest.n_experts * widest


def head_bytes(path: Path, manifest: Manifest, predictor: str, owners: int) -> int:
    """Predictor heads: the trained file's tensors, or untrained router copies (E x d fp32)."""
    if predictor == "heads":
        from edge0.layout.safetensors_io import read_header
        from edge0.routing.prerouter import WEIGHTS_FILE

        header = read_header(path / WEIGHTS_FILE)
        return sum(int(np.prod(v.shape, dtype=np.int64)) * v.itemsize for v in header.values())
    if predictor == "init":
        d = int(_text(manifest.config)["hidden_size"])
        return owners * manifest.n_experts * d * 4
    return 0


def with_ram(spec: str, cache: int) -> str:
    """The spec with its `ram` stage sized to `cache` bytes, added in front if missing, or
    dropped when `cache` is 0."""
    stages = parse_spec(spec)
    names = [st.name for st in stages]
    if "ram" in names:
        i = names.index("ram")
        if cache <= 0:
            return format_spec(stages[:i] + stages[i + 1 :])
        ram = stages[i]
        opts = tuple((k, v) for k, v in ram.options if k != "budget")
        stages[i] = TierStage("ram", str(cache), opts)
        return format_spec(stages)
    if cache <= 0:
        return spec
    return format_spec([TierStage("ram", str(cache), ()), *stages])


apply_to_spec = with_ram  # the earlier name (edge0.bench.worker)
