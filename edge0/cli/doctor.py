"""`edge0 doctor`: what this installation runs on (versions, device, which kernels)."""

from __future__ import annotations

import platform
from importlib import metadata

import click


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


@click.command("doctor")
def command() -> None:
    """Print versions, the compute device and which matrix kernels run here."""
    import mlx.core as mx

    from edge0.kernels.native import status

    click.echo(
        f"edge0 {_version('edge0')}, mlx {_version('mlx')}, mlx-lm {_version('mlx-lm')}, "
        f"python {platform.python_version()} ({platform.machine()})"
    )
    click.echo(f"device: {mx.default_device()}")
    click.echo(status())
