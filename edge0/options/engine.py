"""`EngineOptions`: how an engine runs, each option declared once (docs/architecture.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from edge0.errors import ConfigError
from edge0.options.declare import check_declared, opt

MODES = ("resident", "reactive", "hint", "route")  # decode modes (docs/runtime.md)
EXACT_MODES = ("resident", "reactive", "hint")  # the true router decides: output as resident's
PREDICTORS = ("oracle", "temporal", "init", "heads")  # oracle replays a recording (API only)
ROUTE_POLICIES = ("predicted", "available-first", "available-first-sync", "deadline")
# first streamed layer: its experts resident in memory; predicted by the last layer's
# wrap-around head; or routed and read on demand (docs/runtime.md has the measurements)
FIRST_LAYER = ("resident", "wrap", "reactive")
KV_CONTEXT = 4096  # tokens of KV cache the memory plan reserves by default
SYNC_EVERY = 4  # route mode: layers per host sync (docs/benchmarks/runtime.md)
MAX_IO_WORKERS = 64  # concurrent expert reads; more add queueing latency, not bandwidth
SERVE_MAX_BATCH = 4  # `edge0 serve`: requests decoded together (docs/benchmarks/batch.md)

ENGINE = ("run", "serve")  # the commands that open an engine
BENCH = ("run", "serve", "bench")  # ... and the benchmark, which compares values
ALL = ("run", "serve", "bench", "sweep")
TUNE = ("tune",)  # `edge0 tune` runs engines of its own, under the same budget and tiers


@attrs.frozen
class EngineOptions:
    """How an engine runs: `Engine.open`'s keywords and the flags of `edge0 run`/`serve`."""

    tiers: Any = opt(
        "ram>pread",
        "Tier stack, outermost first, e.g. 'ram:1GiB>throttle:bw=400MB/s>direct'. A `ram` "
        "stage without a size holds 1 GiB, or what --memory-budget plans; one with a size "
        "keeps it (counted in the plan, refused if it cannot fit). The API also takes a Tier.",
        flag="--tiers",
        commands=BENCH + TUNE,
        value="tiers",
        defaults={"bench": None},  # the benchmark's own: see `edge0 bench run --help`
        repeats=("bench",),
    )
    mode: str | None = opt(
        None,
        "Decode mode: resident, reactive and hint are exact; route computes with the "
        "predicted experts (docs/prerouter.md).",
        flag="--mode",
        commands=ALL,
        choices=MODES,
        default_help="route when the layout's heads carry a validation record "
        "(`edge0 tune`), else hint (exact); resident for a directory that is not a layout",
        defaults={"bench": "resident,reactive,hint,route", "sweep": "reactive,route"},
        lists=("bench", "sweep"),
        old=("--modes",),
    )
    top_k: int | None = opt(
        None,
        "Routing capacity K: experts per token per layer. (The sampler's top-k is --sample-top-k.)",
        kind=int,
        flag="--top-k",
        commands=ALL + TUNE,
        low=1,
        default_help="the model's top-k",
        lists=("bench",),
        old=("--k",),
    )
    predictor: str | None = opt(
        None,
        "Who predicts the next step's experts (hint/route).",
        flag="--predictor",
        commands=ALL,
        choices=PREDICTORS,
        cli_choices=("init", "heads", "temporal"),
        default_help="heads when prerouter.safetensors exists, else init; bench: init",
        defaults={"bench": "init", "sweep": "init"},
        lists=("bench",),
    )
    memory_budget: str | int | None = opt(
        None,
        "Peak memory (RSS), e.g. 3GiB, planned before loading: what resident weights, "
        "slots, KV cache and working memory leave buys more slots or the RAM cache "
        "(docs/memory.md).",
        flag="--memory-budget",
        commands=ALL + TUNE,
        value="size",
    )
    trace: str | Path | None = opt(
        None,
        "Write a Chrome/Perfetto trace (compute + tier worker tracks).",
        flag="--trace",
        commands=ENGINE,
        value="output-file",
    )
    first_layer: str = opt(
        "resident",
        "First MoE layer: experts kept in memory, predicted by the last layer's wrap-around "
        "head, or routed and read on demand.",
        flag="--first-layer",
        commands=ALL + TUNE,
        choices=FIRST_LAYER,
    )
    io_workers: int = opt(
        2,
        "Concurrent tier reads.",
        kind=int,
        flag="--io-workers",
        commands=ALL + TUNE,
        low=1,
        high=MAX_IO_WORKERS,
    )
    sync_every: int | None = opt(
        None,
        "Route mode: evaluate the layers' predictions every G layers (host syncs per token "
        "~ layers/G).",
        kind=int,
        flag="--sync-every",
        commands=BENCH,
        low=1,
        default_help=str(SYNC_EVERY),
        lists=("bench",),
    )
    overlap: bool = opt(
        False,
        "hint and reactive: compute a layer's experts already in memory while its missing "
        "ones are read (exact either way; on 2 vCPUs it measured no faster, "
        "docs/benchmarks/budget.md).",
        kind=bool,
        flag="--overlap",
        commands=BENCH,
    )
    prefetch_width: int | str = opt(
        "auto",
        "hint: predicted experts prefetched per layer, best first: N, or auto (chosen by "
        "measurement: each rank's hit rate against the stall a hit saves and the reader time "
        "a miss wastes; above K only where the slot pool has room). route prefetches its K "
        "(its prediction is the routing) and refuses another N (docs/prerouter.md).",
        kind=int,
        auto=True,
        flag="--prefetch-width",
        commands=BENCH,
        low=1,
        lists=("bench",),
    )
    recording: dict[tuple[int, int], list[int]] | None = None  # for the oracle predictor
    record_routing: bool = False  # keep true routing in steps.recording (to replay as oracle)
    adapter: bool = opt(
        True,
        "Apply the recovery LoRA in MODEL/adapters/ when it exists.",
        kind=bool,
        flag="--adapter",
        commands=ENGINE,
    )
    context: int = opt(
        KV_CONTEXT,
        "Tokens of context (prompt + output) --memory-budget plans the KV cache for; longer "
        "requests are cut there.",
        kind=int,
        flag="--context",
        commands=ENGINE,
        low=1,
    )
    prefill_chunk: int | None = opt(
        None,
        "Prompt tokens per forward; each streamed layer reads its chunk's experts once; 1 "
        "feeds the prompt one token per step.",
        kind=int,
        flag="--prefill-chunk",
        commands=BENCH,
        low=1,
        default_help="256; under --memory-budget the plan's: the largest its share holds, up "
        "to where its reads amortise",
        lists=("bench",),
    )
    hosts: str | int | None = opt(
        None,
        "Pipeline the layers over several ranks: a count of local ranks (2), a comma list "
        "of IPs, or an mlx.launch hosts.json. Under mlx.launch the ranks come from its "
        "environment. See docs/distributed.md.",
        flag="--hosts",
        commands=("run",),
    )
    layers: str | None = opt(
        None,
        "Layers per rank, e.g. 3,5 or 0-2,3-7.",
        flag="--layers",
        commands=("run",),
        default_help="balance resident + streamed memory per rank",
    )
    rank_timeout: float = opt(
        120.0,
        "Seconds a pipeline step may take before rank 0 ends the request with an error.",
        kind=float,
        flag="--rank-timeout",
        commands=("run",),
        low=0.1,
        finite=True,
    )
    max_batch: int = opt(
        1,
        "Requests decoded together, one token each per step; each streamed layer reads the "
        "union of their experts once (the slot pool grows with it; 1: one request at a "
        "time, in arrival order).",
        kind=int,
        flag="--max-batch",
        commands=("serve",),
        low=1,
        defaults={"serve": SERVE_MAX_BATCH},
    )
    token_buffer: int = opt(
        64, "Unread tokens of a batched request before it is paused.", kind=int, low=1
    )
    join_chunk: int | None = opt(
        None,
        "Prompt tokens a request joining a running batch feeds between two of its decode "
        "steps (rounded up to whole prefill chunks).",
        kind=int,
        low=1,
        default_help="its whole prompt before the next step",
    )
    route_policy: str = opt(
        "predicted",
        "Route mode: the experts a layer runs: the set predicted one token ahead, the best "
        "true experts in the slots, chosen in the graph (available-first), the best "
        "servable from slots or RAM, chosen on the host (available-first-sync), or that plus "
        "a same-token head fetching the next layer's experts one layer ahead (deadline) "
        "(docs/benchmarks/route_policy.md).",
        flag="--route-policy",
        commands=BENCH,
        choices=ROUTE_POLICIES,
        lists=("bench",),
        old=("--route-policies",),
    )
    route_deadline_ms: float | None = opt(
        None,
        "available-first/deadline: the longest compute waits per layer for a true expert "
        "that is not servable; inf waits for all (exact routing).",
        kind=float,
        flag="--route-deadline-ms",
        commands=BENCH,
        low=0.0,
        default_help="0",
    )

    @property
    def run_mode(self) -> str:
        """The decode mode once decided (Engine.open decides a None mode from the layout)."""
        if self.mode is None:
            raise ConfigError("no decode mode decided; open the engine with Engine.open")
        return self.mode

    def check(self) -> None:
        """ConfigError for a value out of its declared range, or options that conflict."""
        check_declared(self)
        if self.predictor == "oracle" and self.recording is None:
            raise ConfigError("predictor 'oracle' replays a recording; pass recording= too")
        if self.max_batch > 1 and self.hosts is not None:
            raise ConfigError("--max-batch > 1 is not supported with --hosts; use --max-batch 1")
        if self.route_policy != "predicted" and (
            self.mode not in (None, "route") or self.hosts is not None or self.max_batch > 1
        ):
            raise ConfigError(
                f"--route-policy {self.route_policy} needs --mode route on one process, one "
                f"request per step (got mode {self.mode}"
                f"{', --hosts' if self.hosts is not None else ''}"
                f"{', --max-batch ' + str(self.max_batch) if self.max_batch > 1 else ''})"
            )
