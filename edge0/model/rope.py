"""Rotary position embeddings as transformers computes them, for every `rope_type`, in MLX.

`inv_freq(rope, dims, max_positions, seq_len)` is transformers' `ROPE_INIT_FUNCTIONS`
(modeling_rope_utils) in numpy float32: the inverse frequencies of the rotated pairs and
the attention factor that scales cos and sin. `Rope` is an MLX module with mlx-lm's rope
call (`rope(x, offset)`) that rotates the first `dims` features with them: the factor
scales the rotated features (rotation is linear, so scaling its input scales cos and sin),
`dynamic` and `longrope` recompute their frequencies from the sequence length of each
call as transformers does per forward (`seq_len = the last position + 1`). `install`
puts one in place of each rope module of a built mlx-lm model whose config asks for a
scaled rope; a plain rope keeps mlx-lm's (and the native kernel's) own.
"""

from __future__ import annotations

import math
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from edge0.kernels.ops import rope as rope_op

# rope types whose frequencies depend on the sequence length of the forward
PER_SEQUENCE = ("dynamic", "longrope")
TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope", "proportional")


def rope_type(rope: dict[str, Any] | None) -> str:
    """The `rope_type` of `rope_parameters` (older configs: `type`; absent: default)."""
    rope = rope or {}
    return str(rope.get("rope_type", rope.get("type", "default")))


def _base(dims: int, theta: float) -> np.ndarray:
    """theta ** (2i / dims) for each rotated pair, float32 as transformers builds it."""
    return np.float32(theta) ** (np.arange(0, dims, 2, dtype=np.float32) / np.float32(dims))


def inv_freq(
    rope: dict[str, Any], dims: int, max_positions: int, seq_len: int | None = None
) -> tuple[np.ndarray, float]:
    """(inverse frequencies (dims/2,) float32, attention factor) of `rope_parameters`.

    `dims`: the rotated features (head_dim x partial_rotary_factor, or the whole head for
    `proportional`, which rotates its leading share); `max_positions`: the config's
    max_position_embeddings; `seq_len`: the forward's last position + 1 (dynamic,
    longrope; None: at initialisation, as transformers' init does).
    """
    kind, theta = rope_type(rope), float(rope.get("rope_theta", 10000.0))
    if kind == "default":
        return (1.0 / _base(dims, theta)).astype(np.float32), 1.0
    if kind == "linear":
        return (1.0 / _base(dims, theta) / np.float32(rope["factor"])).astype(np.float32), 1.0
    if kind == "dynamic":
        return _dynamic(rope, theta, dims, max_positions, seq_len), 1.0
    if kind == "yarn":
        return _yarn(rope, theta, dims, max_positions)
    if kind == "llama3":
        return _llama3(rope, theta, dims), 1.0
    if kind == "longrope":
        return _longrope(rope, theta, dims, max_positions, seq_len)
    if kind == "proportional":
        return _proportional(rope, theta, dims), 1.0
    raise ValueError(f"rope_type {kind!r} is not one of {', '.join(TYPES)}")


def _dynamic(
    rope: dict[str, Any], theta: float, dims: int, max_positions: int, seq_len: int | None
) -> np.ndarray:
    seq = max(seq_len or max_positions, max_positions)
    factor = float(rope["factor"])
    base = theta * ((factor * seq / max_positions) - (factor - 1)) ** (dims / (dims - 2))
    return (1.0 / _base(dims, base)).astype(np.float32)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's `0.1 * mscale * log(scale) + 1` (1 for scale <= 1)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(
    rope: dict[str, Any], theta: float, dims: int, max_positions: int
) -> tuple[np.ndarray, float]:
    original = float(rope["original_max_position_embeddings"])
    factor = rope.get("factor")
    factor = float(factor) if factor is not None else max_positions / original
    attention = rope.get("attention_factor")
    if attention is None:  # mscale counts only with mscale_all_dim beside it (transformers)
        mscale, all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
        if mscale and all_dim:
            attention = yarn_mscale(factor, mscale) / yarn_mscale(factor, all_dim)
        else:
            attention = yarn_mscale(factor)
    fast, slow = rope.get("beta_fast") or 32, rope.get("beta_slow") or 1

    def correction(rotations: float) -> float:
        return dims * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction(fast), correction(slow)
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dims - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(dims // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extrapolation = (1 - ramp).astype(np.float32)  # 1: the original frequency
    pos = _base(dims, theta)
    inv = (1.0 / (factor * pos)) * (1 - extrapolation) + (1.0 / pos) * extrapolation
    return inv.astype(np.float32), float(attention)


def _llama3(rope: dict[str, Any], theta: float, dims: int) -> np.ndarray:
    inv = (1.0 / _base(dims, theta)).astype(np.float32)
    factor, low, high = float(rope["factor"]), rope["low_freq_factor"], rope["high_freq_factor"]
    old = float(rope["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
    with np.errstate(divide="ignore", invalid="ignore"):  # low == high: no medium band to smooth
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def _longrope(
    rope: dict[str, Any], theta: float, dims: int, max_positions: int, seq_len: int | None
) -> tuple[np.ndarray, float]:
    original = float(rope["original_max_position_embeddings"])
    factor = rope.get("factor")
    factor = float(factor) if factor is not None else max_positions / original
    attention = rope.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    long = seq_len is not None and seq_len > original
    ext = np.asarray(rope["long_factor" if long else "short_factor"], dtype=np.float32)
    return (1.0 / (ext * _base(dims, theta))).astype(np.float32), float(attention)


def _proportional(rope: dict[str, Any], theta: float, dims: int) -> np.ndarray:
    angles = int(float(rope.get("partial_rotary_factor", 1.0)) * dims // 2)
    rotated = 1.0 / (np.float32(theta) ** (np.arange(0, 2 * angles, 2, dtype=np.float32) / dims))
    inv = np.concatenate([rotated, np.zeros(dims // 2 - angles, np.float32)])
    return (inv / np.float32(rope.get("factor", 1.0))).astype(np.float32)


class Rope(nn.Module):
    """mlx-lm's rope call (`rope(x, offset)`) with transformers' frequencies and factor."""

    def __init__(
        self, dims: int, rope: dict[str, Any], max_positions: int, traditional: bool = False
    ) -> None:
        super().__init__()
        self.dims, self.traditional, self.kind = dims, traditional, rope_type(rope)
        self.max_positions = max_positions
        inv, self.factor = inv_freq(rope, dims, max_positions)
        self._periods = _periods(inv)
        self._rope = dict(rope)
        self._theta = float(rope.get("rope_theta", 10000.0))
        if self.kind == "longrope":  # the two sets, chosen per call by the sequence length
            long, _ = inv_freq(rope, dims, max_positions, seq_len=max_positions + (1 << 30))
            self._long = _periods(long)

    def _freqs(self, seq: mx.array) -> mx.array:
        """The periods for a forward whose last position + 1 is `seq` (int32 scalar)."""
        if self.kind == "dynamic":
            factor, m = float(self._rope["factor"]), float(self.max_positions)
            s = mx.maximum(seq.astype(mx.float32), m)
            base = self._theta * ((factor * s / m) - (factor - 1)) ** (self.dims / (self.dims - 2))
            return mx.power(base, mx.arange(0, self.dims, 2, dtype=mx.float32) / self.dims)
        original = int(self._rope["original_max_position_embeddings"])
        return mx.where(seq > original, self._long, self._periods)

    def __call__(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
        if self.factor != 1.0:
            x = x.at[..., : self.dims].multiply(self.factor)
        if self.kind not in PER_SEQUENCE:
            return self._apply(x, offset, self._periods)
        if isinstance(offset, mx.array) and offset.ndim == 1:  # batch rows: each its own length
            rows = [
                self._apply(x[i : i + 1], offset[i : i + 1], self._freqs(offset[i] + x.shape[-2]))
                for i in range(x.shape[0])
            ]
            return mx.concatenate(rows, axis=0)
        seq = mx.array(offset, dtype=mx.int32) + x.shape[-2]
        return self._apply(x, offset, self._freqs(seq))

    def _apply(self, x: mx.array, offset: int | mx.array, freqs: mx.array) -> mx.array:
        return rope_op(
            x,
            self.dims,
            traditional=self.traditional,
            base=None,
            scale=1.0,
            offset=offset,
            freqs=freqs,
        )


def _periods(inv: np.ndarray) -> mx.array:
    """MLX's `freqs` (periods, 1 / inverse frequency; inf for a pair left unrotated)."""
    with np.errstate(divide="ignore"):
        return mx.array((1.0 / inv.astype(np.float64)).astype(np.float32))


def rope_dims(module: nn.Module) -> int:
    """The features an mlx-lm rope module rotates."""
    for attr in ("dims", "dim"):
        if isinstance(getattr(module, attr, None), int):
            return int(getattr(module, attr))
    if isinstance(getattr(module, "_freqs", None), mx.array):  # one period per rotated pair
        return 2 * int(module._freqs.size)
    raise ValueError(f"{type(module).__name__} does not say how many features it rotates")


def plain(tc: dict[str, Any]) -> dict[str, Any]:
    """`tc` with a scaled rope said as a plain one of the same theta (and rotated share):
    what every mlx-lm class builds, before `install` replaces it."""
    rope = tc.get("rope_parameters") or tc.get("rope_scaling") or {}
    if rope_type(rope) == "default":
        return tc
    keep = ("rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved")
    standin = {"rope_type": "default", **{k: rope[k] for k in keep if k in rope}}
    return {**tc, "rope_parameters": standin, "rope_scaling": None}


def install(
    model: nn.Module, tc: dict[str, Any], attr: str = "rope", traditional: bool | None = None
) -> int:
    """Put a `Rope` of the config's scaled `rope_parameters` in place of every rope module
    named `attr` in `model` (rotated features and pairing as mlx-lm built them, unless
    `traditional` is given); a plain rope is left to mlx-lm. Returns how many it replaced."""
    rope = tc.get("rope_parameters") or tc.get("rope_scaling") or {}
    if rope_type(rope) == "default":
        return 0
    max_positions = int(tc.get("max_position_embeddings") or 0)
    n = 0
    for _, module in model.named_modules():
        old = module.get(attr) if isinstance(module, dict) else None
        if not isinstance(old, nn.Module) or isinstance(old, Rope):
            continue
        dims = rope_dims(old)
        if rope_type(rope) == "proportional":  # the whole head; it rotates its leading share
            dims = round(dims / float(rope.get("partial_rotary_factor", 1.0)))
        pairs = getattr(old, "traditional", False) if traditional is None else traditional
        module[attr] = Rope(dims, rope, max_positions, bool(pairs))
        n += 1
    return n
