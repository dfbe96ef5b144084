"""The OpenBLAS tip that the training and evaluation commands print before loading at fp32."""

from __future__ import annotations

import click


def blas_hint() -> None:
    from edge0.train.blas import openblas_hint

    hint = openblas_hint()
    if hint:
        click.echo(hint, err=True)
