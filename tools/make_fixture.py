"""Write the tiny random HF test checkpoints (qwen3_moe, qwen3_5_moe) under tests/fixtures/.

Deterministic: the same seed gives byte-identical files (tests/test_loader.py checks
this), so the golden logits in tests/fixtures/golden/ stay valid. Usage:

    .venv/bin/python tools/make_fixture.py [--out tests/fixtures] [--only qwen3_moe]
"""

from __future__ import annotations

import shutil
from pathlib import Path

import click

from edge0.synth.tiny import FIXTURE_SPECS, write_checkpoint

ROOT = Path(__file__).resolve().parent.parent


@click.command()
@click.option("--out", type=click.Path(path_type=Path), default=ROOT / "tests" / "fixtures")
@click.option("--only", type=click.Choice(sorted(FIXTURE_SPECS)), default=None)
def main(out: Path, only: str | None) -> None:
    for name, (spec, shards) in FIXTURE_SPECS.items():
        if only is not None and name != only:
            continue
        target = out / name
        shutil.rmtree(target, ignore_errors=True)
        write_checkpoint(spec, target, shards=shards)
        size = sum(f.stat().st_size for f in target.iterdir())
        click.echo(f"{target}: {size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
