r"""A third-party tier, `histogram`: counts reads per layer, flags slow reads; how to plug it in.

A tier is any object with `async read_into(key, dest) -> ReadInfo` and
`async aclose()`. To be usable in spec strings it also declares `name`,
`WRAPS` (True: built as cls(inner, **options); False: a storage tier built as
cls(model_dir, manifest, **options)), `POSITIONAL` and `OPTIONS` (option name
-> converter from text; edge0.storage.spec has parse_size, parse_rate,
parse_duration, parse_bool, parse_int and choice).

A package makes it available to every Edge0 user who installs it with one
entry point in its pyproject.toml:

    [project.entry-points."edge0.tiers"]
    histogram = "my_edge0_tiers.histogram:HistogramTier"

after which `edge0 run out/ --tiers "histogram:5ms>ram:1GiB>direct"` and
`edge0 bench tiers out/ --tiers ...` find it by name. A script or notebook
can skip packaging and call `edge0.storage.spec.register_tier("histogram",
HistogramTier)`, as `demo` below does.

Run: python examples/custom_tier.py [MODEL_DIR]   (default: the demo model)

It reads every expert record twice through `histogram:slow=5ms>ram:64MiB>pread`
and prints the reads per MoE layer (2 x the number of experts each) and how many
reads were slower than 5 ms.

ci-run:
ci-run: {model}
ci-expect: ^reads per layer: \{(\d+: \d+, )*\d+: \d+\}; slower than 5 ms: \d+$
ci-expect: ^every layer read 2 x \d+ records$
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from edge0.layout.manifest import Manifest
from edge0.log import get_logger
from edge0.storage.spec import open_tiers, parse_duration, register_tier
from edge0.storage.tier import ExpertKey, ReadInfo, Tier

log = get_logger("histogram_tier")


class HistogramTier:
    """Wraps any tier; counts reads per layer and logs each read slower than `slow`."""

    name: ClassVar[str] = "histogram"
    WRAPS: ClassVar[bool] = True
    POSITIONAL: ClassVar[str | None] = "slow"
    OPTIONS: ClassVar[dict[str, Callable[[str], Any]]] = {"slow": parse_duration}

    def __init__(self, inner: Tier, *, slow: float = 0.01) -> None:
        self.inner = inner
        self.slow = slow
        self.reads_per_layer: Counter[int] = Counter()
        self.slow_reads = 0

    async def read_into(self, key: ExpertKey, dest: memoryview) -> ReadInfo:
        info = await self.inner.read_into(key, dest)
        self.reads_per_layer[key.layer] += 1
        took = info.finished - info.started
        if took > self.slow:
            self.slow_reads += 1
            log.warning(
                "histogram.slow_read",
                layer=key.layer,
                expert=key.expert,
                ms=round(took * 1e3, 2),
                tier=info.tier,
            )
        return info

    async def aclose(self) -> None:
        await self.inner.aclose()


async def demo(model_dir: Path, spec: str = "histogram:slow=5ms>ram:64MiB>pread") -> HistogramTier:
    """Read every record twice through `spec`; return the histogram tier."""
    register_tier("histogram", HistogramTier)
    manifest = Manifest.load(model_dir)
    tier = open_tiers(spec, model_dir, manifest)
    assert isinstance(tier, HistogramTier)
    buf = np.empty(manifest.record_size, np.uint8)
    for _ in range(2):
        for layer in manifest.moe_layers:
            for expert in range(manifest.n_experts):
                await tier.read_into(ExpertKey(layer, expert), buf.data)
    await tier.aclose()
    return tier


if __name__ == "__main__":
    from _model import parse_args

    path = parse_args(__doc__).model
    hist = asyncio.run(demo(path))
    print(f"reads per layer: {dict(hist.reads_per_layer)}; slower than 5 ms: {hist.slow_reads}")
    n_experts = Manifest.load(path).n_experts
    if set(hist.reads_per_layer.values()) != {2 * n_experts}:
        raise SystemExit("error: some layer was not read exactly twice per expert")
    print(f"every layer read 2 x {n_experts} records")
