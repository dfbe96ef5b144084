"""`EngineOptions`: how an engine runs (the flags of `edge0 run`), and their checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from edge0.errors import ConfigError
from edge0.routing.predictors import NAMES
from edge0.runtime.compute.steps import MODES
from edge0.runtime.layers.policy import DEFAULT_POLICY, check_policy

KV_CONTEXT = 4096  # tokens of KV cache the memory plan reserves by default
# first streamed layer: its experts resident in memory; predicted by the last layer's
# wrap-around head; or routed and read on demand (docs/runtime.md has the measurements)
FIRST_LAYER = ("resident", "wrap", "reactive")
SYNC_EVERY = 4  # route mode: layers per host sync (docs/benchmarks/runtime.md)
MAX_IO_WORKERS = 64  # concurrent expert reads; more add queueing latency, not bandwidth


@attrs.frozen
class EngineOptions:
    """How an engine runs (the CLI flags of `edge0 run` map onto these)."""

    # a spec string or a Tier object; `ram` without a size: 1 GiB, or what --memory-budget plans
    tiers: Any = "ram>pread"
    mode: str = "route"
    top_k: int | None = None  # routing capacity K; None: the model's top-k
    predictor: str | None = None  # None: "heads" when prerouter.safetensors exists, else "init"
    memory_budget: str | int | None = None
    trace: str | Path | None = None  # Chrome trace JSON written at close
    first_layer: str = "resident"  # resident | wrap | reactive (FIRST_LAYER)
    io_workers: int = 2
    sync_every: int | None = None  # route: host syncs every G layers (None: SYNC_EVERY)
    recording: dict[tuple[int, int], list[int]] | None = None  # for the oracle predictor
    record_routing: bool = False  # keep true routing in steps.recording (to replay as oracle)
    adapter: bool = True  # apply MODEL/adapters/ (recovery LoRA) when present
    context: int = KV_CONTEXT  # tokens of context a memory budget plans for (prompt + output)
    # prompt tokens per forward; 1: one token per step; None: DEFAULT_CHUNK, or what the
    # memory plan chooses under a budget (an asked-for chunk must fit the plan)
    prefill_chunk: int | None = None
    # several ranks (edge0.dist): hosts "2", "ip,ip" or hosts.json; layers per rank "4,4"
    hosts: str | int | None = None
    layers: str | None = None
    rank_timeout: float = 120.0  # seconds a rank may take for one step before rank 0 gives up
    # requests decoded together, one token each per step (edge0.runtime.engine.batcher); the slot
    # pool and the KV reserve of a memory plan grow with it
    max_batch: int = 1
    token_buffer: int = 64  # unread tokens of a batched request before it is paused
    # prompt tokens a request joining a running batch feeds between two of its decode steps
    # (rounded up to whole prefill chunks); None: its whole prompt before the next step
    join_chunk: int | None = None
    # route mode: which experts a layer runs (edge0.runtime.layers.policy);
    # deadline None: the default
    route_policy: str = DEFAULT_POLICY
    route_deadline_ms: float | None = None

    def check(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"unknown mode {self.mode!r}; choose one of {', '.join(MODES)}")
        if self.predictor is not None and self.predictor not in NAMES:
            raise ConfigError(
                f"unknown predictor {self.predictor!r}; choose one of {', '.join(NAMES)}"
            )
        if self.first_layer not in FIRST_LAYER:
            raise ConfigError(
                f"first_layer must be one of {', '.join(FIRST_LAYER)}, not {self.first_layer!r}"
            )
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"--top-k must be at least 1, got {self.top_k}")
        if self.sync_every is not None and self.sync_every < 1:
            raise ConfigError(f"--sync-every must be at least 1, got {self.sync_every}")
        if self.context < 1:
            raise ConfigError(f"context must be at least 1 token, got {self.context}")
        if self.prefill_chunk is not None and self.prefill_chunk < 1:
            raise ConfigError(f"--prefill-chunk must be at least 1, got {self.prefill_chunk}")
        if self.max_batch < 1:
            raise ConfigError(f"--max-batch must be at least 1, got {self.max_batch}")
        if self.token_buffer < 1:
            raise ConfigError(f"token_buffer must be at least 1, got {self.token_buffer}")
        if self.join_chunk is not None and self.join_chunk < 1:
            raise ConfigError(f"join_chunk must be at least 1 token, got {self.join_chunk}")
        if self.max_batch > 1 and self.hosts is not None:
            raise ConfigError("--max-batch > 1 is not supported with --hosts; use --max-batch 1")
        if not 1 <= self.io_workers <= MAX_IO_WORKERS:
            raise ConfigError(
                f"--io-workers (io_workers=) must be between 1 and {MAX_IO_WORKERS}, got "
                f"{self.io_workers}: a read queue deeper than a few adds latency, not bandwidth"
            )
        check_policy(self.route_policy, self.route_deadline_ms)
        if self.route_policy != "predicted" and (
            self.mode != "route" or self.hosts is not None or self.max_batch > 1
        ):
            raise ConfigError(
                f"--route-policy {self.route_policy} needs --mode route on one process, one "
                f"request per step (got mode {self.mode}"
                f"{', --hosts' if self.hosts is not None else ''}"
                f"{', --max-batch ' + str(self.max_batch) if self.max_batch > 1 else ''})"
            )
