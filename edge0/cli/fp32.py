"""Full-precision models for the training and evaluation commands, and their OpenBLAS tip."""

from __future__ import annotations

from typing import Any

import click


def load_fp32(path: str, int4: bool = False) -> Any:
    """edge0.load at fp32 (full precision on every backend).

    int4: the int4 student path, as fake quantization (`fake_quantize_student`: the same
    int4 values, fp32 matmuls; the CPU's int4 prefill kernels are ~15x slower).
    """
    import mlx.core as mx

    import edge0.model.loader
    from edge0.train.capture import fake_quantize_student

    loaded = edge0.model.loader.load(path)
    loaded.model.set_dtype(mx.float32)
    if int4:
        fake_quantize_student(loaded.model)
    mx.eval(loaded.model.parameters())
    return loaded


def blas_hint() -> None:
    from edge0.train.blas import openblas_hint

    hint = openblas_hint()
    if hint:
        click.echo(hint, err=True)
