"""`edge0 tune`: traces from the streamed int4 model, heads, validation, one atomic write.

1. Calibration and held-out windows (edge0.tune.corpus) are prefilled by the engine in an
   exact mode under the run's memory budget; every window's routing goes to disk
   (edge0.tune.capture, edge0.tune.store). A killed run resumes after its last window.
2. The heads start from the model's routers and are trained on the calibration traces
   (rows read from disk by edge0.train.rows), with early stopping on windows held out of
   them: the token horizon (route and hint modes), then the layer horizon (the deadline
   policy), in a worker thread; a horizon's heads are kept only where they recall more than
   the untrained rule they started from. A run stopped after training does not train again.
3. The trained heads are written into the layout, then validated on the held-out text:
   recall@K per layer, and route mode against exact mode (agreement, KL). The validation
   record is written last: until it is, the layout's default mode stays exact (`hint`).
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import numpy as np

from edge0.errors import Edge0Error
from edge0.heap import trim
from edge0.layout.artifacts import record_artifacts
from edge0.layout.manifest import Manifest
from edge0.log import get_logger
from edge0.routing.prerouter import PrerouterSet
from edge0.routing.prerouter_config import FILES, PrerouterConfig
from edge0.routing.validation import KEY, Validation
from edge0.train import rows
from edge0.train.heads import HeadTrainConfig, train_heads
from edge0.train.traces import TraceSet, sample_windows, text_encoder
from edge0.tune import corpus as corpora
from edge0.tune.capture import prefill_job
from edge0.tune.store import Shape, TraceStore
from edge0.tune.validate import agreement, decode_logits, head_recall

log = get_logger(__name__)
CHARS_PER_TOKEN = 6  # text asked of the corpus per token wanted (generous: code runs ~3.5-4)
Progress = Callable[[str, int, int], None]  # (phase, done, total)
TRAIN_BATCH = 512  # rows a step, every head


@attrs.frozen
class TuneOptions:
    """What `edge0 tune` does (its flags)."""

    tokens: int = 16384  # calibration tokens traced (windows of seq_len)
    heldout_tokens: int = 2048  # held-out tokens traced, for recall
    validate_tokens: int = 512  # held-out tokens decoded in route and exact mode
    seq_len: int = 256
    top_k: int | None = None  # routing capacity the heads are trained and validated for
    corpus: str | None = None  # a text file; None: the standard library's sources
    max_minutes: float | None = None  # training time limit
    max_steps: int = 4000
    work_dir: Path | None = None  # traces; None: the edge0 cache
    fresh: bool = False  # drop earlier traces
    seed: int = 0
    engine: dict[str, Any] = attrs.field(factory=dict)  # Engine.open keywords (budget, tiers)


async def tune(layout: Path, opts: TuneOptions, progress: Progress | None = None) -> dict[str, Any]:
    """Run the pipeline on `layout`; returns the summary that also goes into prerouter.json."""
    started = time.monotonic()
    report = progress or (lambda phase, done, total: None)
    manifest = Manifest.load(layout)
    text = _corpus(opts)
    work = opts.work_dir or _work_dir(layout, manifest)
    if opts.fresh:
        for part in ("train", "heldout"):
            (work / part / "state.json").unlink(missing_ok=True)
    stores, init = await _trace(layout, manifest, text, opts, work, report)
    # training and the recall measurements block for minutes: off the event loop
    summary, record, k, config = await asyncio.to_thread(
        _heads_phase, layout, opts, stores, init, text.source, progress, report
    )
    del init  # trained in place: its arrays go before the validation's engines plan
    _release()
    if record["token_heads"] == "untrained":  # nothing to validate: exact stays the default
        return {"training": summary, "validation": record}
    windows = stores[1].tokens()[: max(1, opts.validate_tokens // opts.seq_len)]
    prompt = opts.seq_len // 4
    report("validate (hint, then route)", 0, 1)
    engine = {k_: v for k_, v in opts.engine.items() if k_ != "prefill_chunk"}
    engine["top_k"] = k
    exact = await decode_logits(layout, "hint", windows, prompt, engine, work / "exact.npy")
    _release()  # the hint engine's buffers, kept in MLX's cache after it closed
    route = await decode_logits(layout, "route", windows, prompt, engine, work / "route.npy")
    record.update(await asyncio.to_thread(agreement, exact, route))
    del exact, route
    for name in ("exact.npy", "route.npy"):
        (work / name).unlink(missing_ok=True)
    report("validate (hint, then route)", 1, 1)
    record["k"] = k
    record["corpus"] = text.source
    record["seconds"] = round(time.monotonic() - started, 1)
    await asyncio.to_thread(_write_validation, layout, config, summary, record)
    log.info("tune.done", layout=str(layout), **{f: record[f] for f in ("agreement", "recall")})
    return {"training": summary, "validation": record}


def _corpus(opts: TuneOptions) -> corpora.Corpus:
    train_chars = opts.tokens * CHARS_PER_TOKEN
    held_chars = max(opts.heldout_tokens, opts.validate_tokens) * CHARS_PER_TOKEN
    if opts.corpus is not None:
        text = corpora.from_file(opts.corpus)
    else:
        text = corpora.builtin(train_chars, held_chars)
    text.check(opts.seq_len * 5 * 2, opts.seq_len * 5 * 2)  # sample_windows' own minimum
    return text


def _work_dir(layout: Path, manifest: Manifest) -> Path:
    from edge0.model.demo import cache_dir

    key = hashlib.sha256(f"{layout.resolve()}|{manifest.experts_file_size}".encode())
    return cache_dir() / "tune" / key.hexdigest()[:16]


def _heads_phase(
    layout: Path,
    opts: TuneOptions,
    stores: Any,
    init: Any,
    source: str,
    progress: Progress | None,
    report: Progress,
) -> tuple[dict[str, Any], dict[str, Any], int, Any]:
    """Both horizons' heads trained from the traces and measured on the held-out ones, each
    kept only where it beats its untrained rule: (training summary, validation record, K,
    the token heads' config)."""
    layer_init = init.layer_horizon()  # before init is trained in place
    train, held = (s.trace_set("student-int4 (streamed)", str(layout)) for s in stores)
    k = opts.top_k or init.config.top_k
    untrained = head_recall(init, held, k, opts.seed)["recall"]
    n_rows = int(train.meta.windows * 0.9) * (train.meta.seq_len - 1)  # 10% held out of them
    epoch = max(1, n_rows // TRAIN_BATCH)
    cfg = HeadTrainConfig(
        k=k,
        max_steps=opts.max_steps,
        max_minutes=opts.max_minutes,
        seed=opts.seed,
        batch=TRAIN_BATCH,
        eval_every=max(10, min(100, epoch)),  # at least once an epoch of the traces
        patience=4,
    )
    layer_untrained = head_recall(layer_init, held, k, opts.seed)["recall"]
    report("heads (token horizon)", 0, 1)
    trained, summary = _heads(layout, train, init, cfg, stores[0].key, source, progress)
    report("heads (token horizon)", 1, 1)
    record = head_recall(trained, held, k, opts.seed)
    record.update(recall_untrained=untrained, k=k)
    config = trained.config
    del init, trained
    report("heads (layer horizon)", 0, 1)
    layer, _ = _heads(layout, train, layer_init, cfg, stores[0].key, source, progress)
    record["layer_recall"] = head_recall(layer, held, k, opts.seed)["recall"]
    record["layer_recall_untrained"] = layer_untrained
    report("heads (layer horizon)", 1, 1)
    del train, held, layer, layer_init  # the validation's engines plan from here
    _release()
    record["layer_heads"] = _keep(layout, "layer", record["layer_recall"], layer_untrained)
    record["token_heads"] = _keep(layout, "token", record["recall"], untrained)
    return summary, record, k, config


async def _trace(
    layout: Path,
    manifest: Manifest,
    text: corpora.Corpus,
    opts: TuneOptions,
    work: Path,
    report: Progress,
) -> tuple[tuple[TraceStore, TraceStore], PrerouterSet]:
    """Both parts' traces (resumed where a killed run stopped), and the untrained heads."""
    from edge0.runtime.engine.api import Engine

    engine = {"prefill_chunk": opts.seq_len, **opts.engine, "mode": "reactive"}
    async with Engine.open(layout, **engine) as eng:
        encode = text_encoder(eng.tokenizer)
        init: PrerouterSet = await eng.run_on_compute(
            lambda: PrerouterSet.from_model(eng.setup.model)
        )
        cfg = init.config
        stores = []
        parts = (("train", text.train, opts.tokens), ("heldout", text.heldout, opts.heldout_tokens))
        for name, part_text, tokens in parts:
            n = max(2, tokens // opts.seq_len)
            windows = sample_windows(part_text, encode, n, opts.seq_len)
            shape = Shape(n, opts.seq_len, cfg.moe_layers, cfg.d_model, cfg.num_experts, cfg.top_k)
            key = _key(manifest, windows)
            store = TraceStore.open(work / name, shape, key)
            for i in range(store.done, n):
                report(f"traces ({name})", i * opts.seq_len, n * opts.seq_len)
                ids = list(map(int, windows[i]))
                hidden, topk, logits = await eng.run_on_compute(prefill_job(eng, ids))
                store.write(i, hidden, topk, logits, windows[i])
            store.close()  # its writable maps: their pages would count as this process's
            report(f"traces ({name})", n * opts.seq_len, n * opts.seq_len)
            stores.append(store)
    return (stores[0], stores[1]), init


def _key(manifest: Manifest, windows: np.ndarray) -> str:
    """What a store's traces depend on: the model's records and the exact windows."""
    records = {k: v for k, v in manifest.to_json().items() if k != "artifacts_crc32"}  # not heads
    digest = hashlib.sha256(json.dumps(records, sort_keys=True).encode())
    digest.update(np.ascontiguousarray(windows).tobytes())
    return digest.hexdigest()[:24]


def _write_heads(layout: Path, heads: PrerouterSet) -> None:
    """The heads' two files (of their horizon), each replaced atomically (weights first: a
    config always describes weights at least as new as itself)."""
    tmp = layout / ".tune-heads.tmp"
    tmp.mkdir(exist_ok=True)
    heads.save(tmp)
    for name in FILES[heads.config.horizon]:
        os.replace(tmp / name, layout / name)
    tmp.rmdir()
    record_artifacts(layout)  # edge0.json's CRC32s of the heads (`edge0 verify`)


def _write_validation(
    layout: Path, config: PrerouterConfig, training: dict[str, Any], record: dict[str, Any]
) -> None:
    """prerouter.json again, now with the validation record (the default mode's switch)."""
    info = dict(training, **{KEY: record})
    out = attrs.evolve(config, trained=True, info=info).to_json()
    path = layout / FILES["token"][1]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(out, indent=2) + "\n")
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    record_artifacts(layout)
    assert Validation.read(layout) is not None  # the record reads back as the engine reads it


def _heads(
    layout: Path,
    train: TraceSet,
    init: PrerouterSet,
    cfg: HeadTrainConfig,
    key: str,
    corpus: str,
    progress: Progress | None,
) -> tuple[PrerouterSet, dict[str, Any]]:
    """`init`'s horizon trained on the traces and written into the layout; or, when an earlier
    run of the same tune trained it (it stopped later), those heads as written."""
    horizon = init.config.horizon
    before = _trained_before(layout, key, cfg, horizon)
    if before is not None:
        log.info("tune.trained_before", layout=str(layout), horizon=horizon, traces=key)
        return before
    trained, summary = train_heads(train, init, cfg, progress=progress is not None)
    summary["traces"].update(corpus=corpus, key=key)
    trained = PrerouterSet(attrs.evolve(trained.config, info=summary), trained.heads)
    _write_heads(layout, trained)  # trained, not validated: the default mode stays exact
    return trained, summary


def _keep(layout: Path, horizon: str, trained: float, untrained: float) -> str:
    """Which heads of `horizon` the layout keeps: the trained ones, unless they recall less
    on held-out text than the untrained rule they started from (training stopped early, or
    a model whose routing they cannot learn); then their files go and the runtime's
    untrained rule stays."""
    if trained >= untrained:
        return "trained"
    log.warning(
        "tune.untrained_kept", horizon=horizon, recall=round(trained, 4), rule=round(untrained, 4)
    )
    for name in FILES[horizon]:
        (layout / name).unlink(missing_ok=True)
    record_artifacts(layout)
    return "untrained"


def _trained_before(
    layout: Path, traces: str, cfg: HeadTrainConfig, horizon: str
) -> tuple[PrerouterSet, dict[str, Any]] | None:
    """The layout's heads and their training summary when an earlier run of the same tune
    trained them on these traces with these settings (it stopped in validation): training
    is the longest phase, and is not done twice."""
    if not PrerouterSet.exists(layout, horizon):
        return None
    try:
        heads = PrerouterSet.load(layout, horizon)
    except Edge0Error:
        return None
    info = {k: v for k, v in heads.config.info.items() if k != KEY}
    same = json.loads(json.dumps(attrs.asdict(cfg))) == info.get("hparams")
    if not (heads.config.trained and same and info.get("traces", {}).get("key") == traces):
        return None
    return heads, info


def _release() -> None:
    """Memory the traces and training held goes back before the validation's engines open
    (each plans its budget from the process's size at that moment)."""
    gc.collect()
    rows.close()
    mx.clear_cache()
    trim()
