"""`edge0 eval` and `edge0 eval routing`: how well each predictor foresees the next experts."""

from __future__ import annotations

import json
from pathlib import Path

import click

from edge0.cli.options import renamed


@click.group("eval")
def command() -> None:
    """Measure a model: routing prediction and quality against the teacher."""


@command.command("routing")
@click.argument("model", type=click.Path(exists=True, file_okay=False))
@click.argument("corpus", type=click.Path(exists=True))
@renamed(
    "--top-k",
    "--k",
    dest="ks",
    type=int,
    multiple=True,
    help="K to score (repeatable) [default: top-k and top-k/2].",
)
@click.option("--tokens", default=16384, show_default=True, help="Held-out tokens to score.")
@click.option("--seq-len", default=256, show_default=True)
@click.option(
    "--split",
    default="heldout",
    show_default=True,
    help="CORPUS/<split>.txt when CORPUS is a directory.",
)
@click.option(
    "--heads",
    "heads_dir",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Directory with prerouter.safetensors [default: MODEL].",
)
@click.option("--int4", is_flag=True, help="Score on the int4 student path (quantized in memory).")
@click.option(
    "--json",
    "json_out",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write the JSON here.",
)
@click.option("--seed", default=0, show_default=True)
def routing(
    model: str,
    corpus: str,
    ks: tuple[int, ...],
    tokens: int,
    seq_len: int,
    split: str,
    heads_dir: str | None,
    int4: bool,
    json_out: str | None,
    seed: int,
) -> None:
    """Recall@K, exact set, F1 and mass of shuffle/temporal/init/trained on held-out text,
    and of the same-token next-layer predictors layer-init/layer-trained (--heads DIR's
    prerouter-layer.safetensors, from `edge0 train heads --horizon layer`)."""
    from edge0.cli.fp32 import blas_hint
    from edge0.eval.routing import evaluate_routing, markdown
    from edge0.routing.prerouter import PrerouterSet
    from edge0.train.fp32 import load_fp32
    from edge0.train.traces import corpus_text, sample_windows, text_encoder

    blas_hint()
    loaded = load_fp32(model, int4=int4)
    src = Path(heads_dir or model)
    trained = PrerouterSet.load(src) if PrerouterSet.exists(src) else None
    if trained is None:
        click.echo(f"no prerouter heads in {src}: scoring shuffle/temporal/init only", err=True)
    layer = PrerouterSet.load(src, "layer") if PrerouterSet.exists(src, "layer") else None
    windows = sample_windows(
        corpus_text(corpus, split),
        text_encoder(loaded.tokenizer),
        max(1, tokens // seq_len),
        seq_len,
    )
    top_k = PrerouterSet.from_model(loaded.model).config.top_k
    k_list = list(ks) or sorted({top_k, max(1, top_k // 2)}, reverse=True)
    result = evaluate_routing(
        loaded.model, windows, k_list, trained=trained, seed=seed, layer_trained=layer
    )
    result.update(
        model=str(model),
        corpus=str(corpus),
        split=split,
        int4=int4,
        heads=str(src) if trained else None,
        layer_heads=str(src) if layer else None,
    )
    click.echo(markdown(result))
    if json_out:
        Path(json_out).write_text(json.dumps(result, indent=2) + "\n")


# Student vs teacher quality (edge0/cli/lora_cmds.py).
from edge0.cli.lora_cmds import quality as _quality  # noqa: E402

command.add_command(_quality)
