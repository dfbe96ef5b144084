"""`edge0 train traces|heads`: teacher routing traces and prerouter head distillation."""

from __future__ import annotations

import json
from pathlib import Path

import click

from edge0.cli import lora_cmds
from edge0.cli.fp32 import blas_hint
from edge0.cli.options import renamed
from edge0.log import get_logger
from edge0.train.fp32 import load_fp32

log = get_logger(__name__)


@click.group("train")
def command() -> None:
    """Train Edge0's quality artifacts (prerouter heads; recovery LoRA)."""


@command.command("traces")
@click.argument("teacher", type=click.Path(exists=True, file_okay=False))
@click.argument("corpus", type=click.Path(exists=True))
@click.argument("out", type=click.Path(file_okay=False))
@click.option(
    "--tokens", default=131072, show_default=True, help="Tokens to trace (bounds disk and RAM)."
)
@click.option("--seq-len", default=256, show_default=True, help="Tokens per window.")
@click.option("--batch", default=4, show_default=True, help="Windows per forward pass.")
@click.option("--shard-tokens", default=16384, show_default=True, help="Tokens per shard file.")
@click.option(
    "--split",
    default="train",
    show_default=True,
    help="CORPUS/<split>.txt when CORPUS is a directory.",
)
@click.option(
    "--student-path",
    is_flag=True,
    help="Take the head inputs (hidden, top-k) from the int4 student; targets stay the teacher's.",
)
def traces(
    teacher: str,
    corpus: str,
    out: str,
    tokens: int,
    seq_len: int,
    batch: int,
    shard_tokens: int,
    split: str,
    student_path: bool,
) -> None:
    """Run TEACHER (fp32) over CORPUS and write routing traces to OUT."""
    from edge0.train import traces as tr

    blas_hint()
    loaded = load_fp32(teacher)
    student = load_fp32(teacher, int4=True).model if student_path else None
    text = tr.corpus_text(corpus, split)
    n = max(2, tokens // seq_len)
    windows = tr.sample_windows(text, tr.text_encoder(loaded.tokenizer), n, seq_len)
    meta = tr.collect(
        loaded.model,
        windows,
        Path(out),
        student=student,
        batch=batch,
        shard_windows=max(1, shard_tokens // seq_len),
        model_name=str(teacher),
    )
    click.echo(
        f"wrote {meta.windows * meta.seq_len} tokens x {len(meta.moe_layers)} MoE layers "
        f"in {len(meta.shards)} shards to {out} (inputs from the {meta.source})"
    )


@command.command("heads")
@click.argument("traces", type=click.Path(exists=True, file_okay=False))
@click.argument("model", type=click.Path(exists=True, file_okay=False))
@renamed(
    "--top-k",
    "--k",
    dest="k",
    type=int,
    default=None,
    help="Routing capacity of the set term [default: model top-k].",
)
@click.option("--hidden", type=int, default=None, help="Head width [default: d_model // 4].")
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Where prerouter.safetensors/json go [default: MODEL].",
)
@click.option("--batch", default=512, show_default=True)
@click.option("--lr", default=2e-3, show_default=True)
@click.option("--set-weight", default=0.5, show_default=True, help="Weight of the top-K BCE term.")
@click.option("--max-steps", default=4000, show_default=True)
@click.option("--eval-every", default=100, show_default=True)
@click.option(
    "--patience", default=6, show_default=True, help="Held-out evals without improvement."
)
@click.option("--max-minutes", type=float, default=None, help="Stop after this long.")
@click.option("--seed", default=0, show_default=True)
@click.option(
    "--horizon",
    type=click.Choice(["token", "layer"]),
    default="token",
    show_default=True,
    help="token: next MoE layer at t+1 (route mode); layer: next MoE layer at the same token "
    "(written to prerouter-layer.safetensors/json).",
)
def heads(
    traces: str,
    model: str,
    k: int | None,
    hidden: int | None,
    out: str | None,
    batch: int,
    lr: float,
    set_weight: float,
    max_steps: int,
    eval_every: int,
    patience: int,
    max_minutes: float | None,
    seed: int,
    horizon: str,
) -> None:
    """Distil prerouter heads for MODEL from TRACES; write them into MODEL (or --out)."""
    from edge0.cli.stream import is_layout
    from edge0.layout.artifacts import record_artifacts
    from edge0.routing.prerouter import PrerouterSet
    from edge0.train.heads import HeadTrainConfig, train_heads
    from edge0.train.traces import TraceSet

    blas_hint()
    loaded = load_fp32(model)
    init = PrerouterSet.from_model(loaded.model, hidden=hidden, horizon=horizon)
    ts = TraceSet.load(traces)
    cfg = HeadTrainConfig(
        k=k or init.config.top_k,
        hidden=hidden,
        batch=batch,
        lr=lr,
        set_weight=set_weight,
        max_steps=max_steps,
        eval_every=eval_every,
        patience=patience,
        max_minutes=max_minutes,
        seed=seed,
    )
    trained, summary = train_heads(ts, init, cfg)
    path = trained.save(out or model)
    if is_layout(path.parent):  # the layout's edge0.json records the heads' CRC32s
        record_artifacts(path.parent)
    click.echo(json.dumps({k: v for k, v in summary.items() if k != "hparams"}, indent=2))
    click.echo(
        f"{horizon}-horizon held-out recall@{cfg.k}: "
        f"{summary['heldout_recall_init']:.3f} (init) -> "
        f"{summary['heldout_recall']:.3f} (trained); wrote {path}"
    )


command.add_command(lora_cmds.sft)  # recovery LoRA stages 2 and 3
command.add_command(lora_cmds.distill)
