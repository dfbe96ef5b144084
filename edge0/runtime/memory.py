"""`--memory-budget`: size the RAM expert cache from what is left after everything else.

budget = resident weights + slot tables + KV cache (estimated for the context)
         + process overhead (interpreter, libraries: RSS measured before loading)
         + decode working memory (MLX temporaries: 3/4 of the slot table, as measured
           on the 35B-A3B shape, docs/benchmarks/35b-route.md)
         + RAM cache.
The RAM cache gets the remainder; the tier spec's `ram` stage is sized to it (or
one is put in front of the stack when the spec has none).
"""

from __future__ import annotations

from typing import Any

import attrs

from edge0.errors import ConfigError
from edge0.storage.spec import parse_size, parse_spec

_MIB = 1 << 20


@attrs.frozen
class MemoryPlan:
    budget: int
    resident: int
    slots: int
    kv: int
    cache: int  # bytes left for the RAM cache tier
    overhead: int = 0  # process RSS before the model was loaded
    working: int = 0  # decode-time MLX temporaries

    def line(self) -> str:
        return (
            f"memory budget {self.budget / _MIB:.0f} MiB = resident {self.resident / _MIB:.0f} + "
            f"slots {self.slots / _MIB:.0f} + KV {self.kv / _MIB:.0f} + "
            f"process {self.overhead / _MIB:.0f} + working {self.working / _MIB:.0f} + "
            f"RAM cache {self.cache / _MIB:.0f} MiB"
        )


def to_bytes(value: str | int) -> int:
    if isinstance(value, int):
        return value
    try:
        return parse_size(value)
    except ValueError as exc:
        raise ConfigError(f"--memory-budget: {exc}") from None


def working_bytes(slots: int) -> int:
    """Decode-time MLX temporaries: 3/4 of the slot table (measured on the 35B-A3B shape)."""
    return slots * 3 // 4


def plan(
    budget: str | int, resident: int, slots: int, kv: int, overhead: int = 0, working: int = 0
) -> MemoryPlan:
    """Split `budget`; ConfigError naming the numbers when it cannot hold the fixed parts."""
    total = to_bytes(budget)
    fixed = resident + slots + kv + overhead + working
    left = total - fixed
    if left < 0:
        raise ConfigError(
            f"--memory-budget {total / _MIB:.0f} MiB is below the {fixed / _MIB:.0f} MiB that "
            f"resident weights ({resident / _MIB:.0f}), slot tables ({slots / _MIB:.0f}), KV "
            f"cache ({kv / _MIB:.0f}), process ({overhead / _MIB:.0f}) and decode working "
            f"memory ({working / _MIB:.0f}) need; raise the budget or lower --top-k"
        )
    return MemoryPlan(total, resident, slots, kv, left, overhead, working)


def kv_bytes(config: dict[str, Any], context: int, itemsize: int = 4) -> int:
    """KV cache of `context` tokens for the full-attention layers of a config (an estimate)."""
    c: dict[str, Any] = config.get("text_config") or config
    layers = int(c.get("num_hidden_layers", 0))
    layer_types = c.get("layer_types")
    interval = int(c.get("full_attention_interval", 1) or 1)
    heads = int(c.get("num_key_value_heads") or c.get("num_attention_heads") or 1)
    head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // int(c["num_attention_heads"]))
    if layer_types:  # transformers' explicit per-layer list (qwen3_5_moe, qwen3_next)
        attn_layers = sum(1 for t in layer_types if t == "full_attention")
    else:
        attn_layers = layers // interval if interval > 1 else layers
    return 2 * attn_layers * heads * head_dim * context * itemsize


def apply_to_spec(spec: str, cache: int) -> str:
    """The spec with its `ram` stage sized to `cache` bytes (added in front if missing)."""
    stages = [s.strip() for s in spec.split(">")]
    names = [st.name for st in parse_spec(spec)]
    if "ram" in names:
        i = names.index("ram")
        _, _, opts = stages[i].partition(":")
        rest = [o for o in opts.split(",") if o.strip() and "=" in o and
                not o.strip().startswith("budget=")]  # fmt: skip
        stages[i] = ":".join(["ram", ",".join([str(cache), *rest])])
        return ">".join(stages)
    if cache <= 0:
        return spec
    return ">".join([f"ram:{cache}", *stages])
