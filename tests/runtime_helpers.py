"""Helpers for the runtime tests: tiny edge0-layout stores and an in-memory MockTier."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from edge0 import log
from edge0.errors import TierReadError
from edge0.layout.convert import ConvertOptions, convert
from edge0.layout.manifest import EXPERTS_FILE, Manifest
from edge0.storage.tier import ExpertKey, ReadInfo
from edge0.synth.tiny import TinySpec, write_checkpoint

log.configure("warning")  # per-read debug events would dominate the test time
PROMPT = [5, 17, 42, 7, 99]


def build_store(root: Path, model_type: str, seed: int = 0, **spec: int) -> Path:
    """A tiny random HF checkpoint converted to the edge0 layout; returns the layout dir."""
    tag = "-".join(f"{k}{v}" for k, v in sorted(spec.items()))
    out = root / f"{model_type}-{seed}-{tag}"
    if not (out / "e0" / "edge0.json").is_file():
        write_checkpoint(TinySpec(model_type=model_type, seed=seed, **spec), out / "hf")
        convert(out / "hf", out / "e0", ConvertOptions(group_size=32))
    return out / "e0"


class MockTier:
    """Serves records from memory (a copy of experts.bin), with optional delay and faults.

    Args:
        delay: seconds each read takes (an asyncio sleep: the loop stays free).
        fail: keys whose reads raise TierReadError while `faults_left` > 0.
    """

    name = "mock"

    def __init__(
        self,
        path: Path,
        delay: float = 0.0,
        fail: set[ExpertKey] | None = None,
        faults: int = 1_000_000,
    ) -> None:
        self.manifest = Manifest.load(path)
        self.data = np.fromfile(path / EXPERTS_FILE, dtype=np.uint8)
        self.delay = delay
        self.fail = fail or set()
        self.faults_left = faults
        self.reads: list[ExpertKey] = []
        self.closed = False

    async def read_into(self, key: ExpertKey, dest: memoryview) -> ReadInfo:
        start = time.perf_counter()
        self.reads.append(key)
        if self.delay:
            await asyncio.sleep(self.delay)
        if key in self.fail and self.faults_left > 0:
            self.faults_left -= 1
            raise TierReadError("injected fault", file="mock", layer=key.layer, expert=key.expert)
        off = self.manifest.record_offset(key.layer, key.expert)
        size = self.manifest.record_size
        np.frombuffer(dest, dtype=np.uint8)[:] = self.data[off : off + size]
        return ReadInfo(self.name, size, start, time.perf_counter())

    async def aclose(self) -> None:
        self.closed = True


class Recording:
    """Token hooks that keep every row of log-probabilities the sampler draws from (one per
    forward; the logits less their log-sum-exp)."""

    def __init__(self) -> None:
        self.seen: list[mx.array] = []

    def mask(self, logprobs: mx.array) -> mx.array:
        self.seen.append(logprobs)
        return logprobs

    def drawn(self, logprobs: mx.array, token: mx.array) -> None:
        pass
