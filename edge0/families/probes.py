"""Rope parameters the config audit's probes and fixtures use (small, so the tiny fixtures
cross their thresholds): one of each `rope_type` transformers computes."""

from __future__ import annotations

from typing import Any

YARN: dict[str, Any] = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 16,
}
LINEAR: dict[str, Any] = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}
DYNAMIC: dict[str, Any] = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
LLAMA3: dict[str, Any] = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
LONGROPE: dict[str, Any] = {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 16,
    "short_factor": [1.0] * 8,
    "long_factor": [float(i + 1) for i in range(8)],
}
ROPES = {"linear": LINEAR, "dynamic": DYNAMIC, "yarn": YARN, "llama3": LLAMA3, "longrope": LONGROPE}


def longrope(pairs: int, **extra: Any) -> dict[str, Any]:
    """LONGROPE with one short and one long factor per rotated pair (`pairs` of them)."""
    factors = {"short_factor": [1.0] * pairs, "long_factor": [float(i + 1) for i in range(pairs)]}
    return {**LONGROPE, **factors, **extra}
