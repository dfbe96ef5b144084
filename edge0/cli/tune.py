"""`edge0 tune MODEL`: train and validate routing heads on this machine, inside its budget."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click

from edge0.cli.checks import model_arg, runtime_args
from edge0.cli.options import engine_options, take
from edge0.errors import ConfigError
from edge0.log import get_logger
from edge0.options.engine import EngineOptions
from edge0.routing.validation import ROUTE_FLOOR

log = get_logger(__name__)


@click.command("tune")
@click.argument("model")
@click.option(
    "--corpus",
    type=click.Path(exists=True),
    default=None,
    help="UTF-8 text to calibrate on (its last tenth is held out), or a directory with "
    "train.txt and heldout.txt [default: this Python's standard-library sources].",
)
@click.option(
    "--tokens",
    type=click.IntRange(512),
    default=16384,
    show_default=True,
    help="Calibration tokens traced.",
)
@click.option(
    "--heldout-tokens",
    type=click.IntRange(256),
    default=2048,
    show_default=True,
    help="Held-out tokens traced, for recall.",
)
@click.option(
    "--validate-tokens",
    type=click.IntRange(64),
    default=512,
    show_default=True,
    help="Held-out tokens decoded in route and in exact mode, for agreement and KL.",
)
@click.option(
    "--seq-len", type=click.IntRange(16), default=256, show_default=True, help="Tokens a window."
)
@click.option(
    "--max-minutes",
    type=click.FloatRange(0.1),
    default=None,
    help="Stop training each horizon after this long (the best heads so far are kept).",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where traces go (and a killed run resumes from) [default: the edge0 cache].",
)
@click.option("--fresh", is_flag=True, help="Trace again instead of resuming.")
@engine_options("tune")
def command(
    model: str,
    corpus: str | None,
    tokens: int,
    heldout_tokens: int,
    validate_tokens: int,
    seq_len: int,
    max_minutes: float | None,
    work_dir: Path | None,
    fresh: bool,
    **kw: Any,
) -> None:
    """Train MODEL's routing heads on traces of its own int4 experts, streamed under the
    memory budget, and validate them on held-out text.

    MODEL is an edge0-layout directory or a Hugging Face id (downloaded and converted on
    first use). The heads and their validation record go into the layout; from then on
    `edge0 run` on it defaults to route mode (approximate; the record says how close),
    where before it ran hint mode (exact). A killed run resumes from its traces.
    """
    engine = take(EngineOptions, "tune", kw)
    model_arg(model)
    runtime_args(engine)
    from edge0.cli.stream import is_layout
    from edge0.hub.resolve import runnable
    from edge0.loop import run
    from edge0.tune.pipeline import TuneOptions, tune

    path = runnable(model, progress=sys.stderr.isatty())
    if not is_layout(path):
        raise ConfigError(
            f"{model} is not an edge0-layout directory; convert it first: `edge0 convert "
            f"{model} OUT`, then `edge0 tune OUT`"
        )
    opts = TuneOptions(
        tokens=tokens,
        heldout_tokens=heldout_tokens,
        validate_tokens=validate_tokens,
        seq_len=seq_len,
        top_k=engine.pop("top_k", None),
        corpus=corpus,
        max_minutes=max_minutes,
        work_dir=work_dir,
        fresh=fresh,
        engine=engine,
    )
    start = time.monotonic()
    bars = Bars()
    try:
        out = run(tune(path, opts, bars.update))
    finally:
        bars.close()
    _print(path, out, time.monotonic() - start)


class Bars:
    """Progress a phase at a time, with its ETA: a tqdm bar on a terminal, else a line on
    stderr at each phase's start and end and at most once every `every` seconds between."""

    def __init__(self, every: float = 60.0) -> None:
        self.bar: Any = None
        self.phase = ""
        self.tty = sys.stderr.isatty()
        self.every = every
        self.started = self.printed = 0.0
        self.last: tuple[str, int] = ("", -1)

    def update(self, phase: str, done: int, total: int) -> None:
        if phase != self.phase:
            self.close()
            self.phase = phase
            self.started = self.printed = time.monotonic()
            if self.tty:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc=phase, unit="tok", leave=False)
            else:
                self._line(done, total)
        if self.bar is not None:
            self.bar.n = done
            self.bar.refresh()
        elif time.monotonic() - self.printed >= self.every or done >= total:
            self._line(done, total)

    def _line(self, done: int, total: int) -> None:
        if (self.phase, done) == self.last:
            return  # a phase found done on start (resumed): one line, not two
        self.last = (self.phase, done)
        now = time.monotonic()
        self.printed = now
        spent = now - self.started
        eta = ""
        if 0 < done < total:
            eta = f", about {_minutes(spent * (total - done) / done)} left"
        if total == 1:  # a phase without a count (training): its start and its end
            where = "started" if done == 0 else f"done in {_minutes(spent)}"
            click.echo(f"tune: {self.phase} {where}", err=True)
        else:
            click.echo(
                f"tune: {self.phase} {done:,}/{total:,} tok, {_minutes(spent)} in this phase{eta}",
                err=True,
            )
        log.info("tune.progress", phase=self.phase, done=done, total=total, seconds=spent)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _print(path: Path, out: dict[str, Any], seconds: float) -> None:
    t, v = out["training"], out["validation"]
    click.echo(
        f"heads: recall@{v['k']} {v['recall_untrained']:.3f} (untrained) -> "
        f"{v['recall']:.3f} on held-out text (same experts as the last token: "
        f"{v['temporal_recall']:.3f}); {t['steps_run']} steps"
    )
    if "layer_recall" in v:
        kept = "" if v["layer_heads"] == "trained" else "; below the untrained rule, which stays"
        click.echo(
            f"layer-horizon heads (the deadline policy's): recall@{v['k']} "
            f"{v['layer_recall_untrained']:.3f} (untrained) -> {v['layer_recall']:.3f}{kept}"
        )
    if v.get("token_heads") == "untrained":
        click.echo(
            f"the trained heads recall less than the untrained rule they started from, so tune "
            f"kept the rule and wrote no heads into {path} in {seconds / 60:.1f} min; `edge0 "
            "run` on it stays in hint mode (exact). More --tokens or a longer --max-minutes "
            "may train better ones"
        )
        return
    click.echo(
        f"route vs exact on {v['tokens']} held-out tokens: next-token agreement "
        f"{v['agreement']:.1%}, KL mean {v['kl_mean']:.4f} (p99 {v['kl_p99']:.4f})"
    )
    written = f"wrote the heads and their validation into {path} in {seconds / 60:.1f} min"
    if v["agreement"] >= ROUTE_FLOOR:
        click.echo(
            f"{written}; `edge0 run` on it now defaults to route mode (approximate; --mode "
            "hint is exact)"
        )
    else:
        click.echo(
            f"{written}; the agreement is below the {ROUTE_FLOOR:.0%} that makes route the "
            "default, so `edge0 run` keeps hint mode (exact; the heads prefetch), and --mode "
            "route runs them as the routing"
        )
