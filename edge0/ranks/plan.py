"""The `--layers` split: contiguous layer ranges per rank, balancing each rank's fixed memory."""

from __future__ import annotations

import attrs

from edge0.errors import ConfigError
from edge0.layout.manifest import Manifest


@attrs.frozen
class Split:
    """`ranges[r]` = the model layers rank r owns (contiguous, in order, covering all)."""

    ranges: tuple[range, ...]
    cost: tuple[int, ...] = ()  # per rank: the balanced bytes (edge0.ranks.budget)

    def owner(self, layer: int) -> int:
        for r, rng in enumerate(self.ranges):
            if layer in rng:
                return r
        raise ConfigError(f"layer {layer} belongs to no rank of the split {self.text()}")

    def text(self) -> str:
        return ",".join(str(len(r)) for r in self.ranges)


def parse_layers(text: str, n_layers: int, size: int) -> Split:
    """`--layers 4,4` (layers per rank) or `0-3,4-7` (ranges), checked against the model."""
    counts = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                a, b = (int(x) for x in part.split("-"))
                counts.append(b - a + 1)
            else:
                counts.append(int(part))
        except ValueError:
            raise ConfigError(
                f"--layers {text}: expected layers per rank like 4,4 or ranges like 0-3,4-7"
            ) from None
    if len(counts) != size or any(c < 1 for c in counts) or sum(counts) != n_layers:
        raise ConfigError(
            f"--layers {text}: needs {size} positive counts summing to the model's "
            f"{n_layers} layers"
        )
    return Split(_ranges(counts))


def _min_max(
    weights: list[int], size: int, cap: list[int] | None = None, limit: float = float("inf")
) -> list[int] | None:
    """Layers per part of the contiguous split of `weights` into `size` parts minimising the
    largest part's weight, with every part's `cap` sum at most `limit` (exact DP); None if
    no split fits."""
    n = len(weights)
    cap = cap or weights
    pw, pc = [0], [0]
    for w, c in zip(weights, cap, strict=True):
        pw.append(pw[-1] + w)
        pc.append(pc[-1] + c)
    inf = float("inf")
    # best[r][i]: the smallest largest part splitting the first i layers into r parts
    best = [[inf] * (n + 1) for _ in range(size + 1)]
    cut = [[0] * (n + 1) for _ in range(size + 1)]
    best[0][0] = 0
    for r in range(1, size + 1):
        for i in range(r, n - (size - r) + 1):
            for j in range(r - 1, i):
                if pc[i] - pc[j] > limit:
                    continue
                v = max(best[r - 1][j], pw[i] - pw[j])
                if v < best[r][i]:
                    best[r][i], cut[r][i] = v, j
    if best[size][n] == inf:
        return None
    counts, i = [], n
    for r in range(size, 0, -1):
        j = cut[r][i]
        counts.append(i - j)
        i = j
    return counts[::-1]


def balance(costs: list[int], size: int) -> Split:
    """Contiguous split of `costs` (bytes per layer) into `size` parts: the largest part as
    small as it can be; among the splits that reach it, layers spread as evenly as they can
    (a rank holding the embedding takes few layers, the others share the rest)."""
    n = len(costs)
    if size > n:
        raise ConfigError(f"{size} ranks for a model of {n} layers: use at most {n} ranks")
    counts = _min_max(costs, size)
    assert counts is not None
    ranges = _ranges(counts)
    peak = max(sum(costs[x] for x in rng) for rng in ranges)
    even = _min_max([1] * n, size, costs, peak)  # fewest layers on the busiest rank
    ranges = _ranges(even or counts)
    return Split(ranges, tuple(sum(costs[x] for x in rng) for rng in ranges))


def plan_split(costs: list[int], size: int, layers: str | None = None) -> Split:
    """The split for `size` ranks: `layers` when given, else balanced by `costs` (bytes per
    layer: edge0.ranks.budget.LayerBytes.costs)."""
    if layers:
        return parse_layers(layers, len(costs), size)
    return balance(costs, size)


def _n_layers(manifest: Manifest) -> int:
    config = manifest.config.get("text_config") or manifest.config
    return int(config["num_hidden_layers"])


def _ranges(counts: list[int]) -> tuple[range, ...]:
    out, start = [], 0
    for c in counts:
        out.append(range(start, start + c))
        start += c
    return tuple(out)
