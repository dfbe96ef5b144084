"""`edge0 run --hosts/--layers/--rank-timeout`: run one model as a pipeline over several ranks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from edge0.dist.hosts import LAUNCHED, launched_rank

DIST_KEYS = ("hosts", "layers", "rank_timeout")


def dist_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option(
            "--hosts",
            default=None,
            help="Pipeline the layers over several ranks: a count of local ranks (2), "
            "a comma list of IPs, or an mlx.launch hosts.json. Under mlx.launch "
            "the ranks come from its environment. See docs/distributed.md.",
        ),
        click.option(
            "--layers",
            default=None,
            help="Layers per rank, e.g. 3,5 or 0-2,3-7 [default: balance resident + "
            "streamed memory per rank].",
        ),
        click.option(
            "--rank-timeout",
            type=click.FloatRange(0.1),
            default=120.0,
            show_default=True,
            help="Seconds a pipeline step may take before rank 0 ends the request with an error.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def resolve(dist: dict[str, Any]) -> dict[str, Any]:
    """Engine options for the pipeline flags (hosts=LAUNCHED under mlx.launch)."""
    hosts = dist["hosts"]
    if hosts is None and launched_rank() is not None:
        hosts = LAUNCHED
    if hosts is None:
        return {}
    return {"hosts": hosts, "layers": dist["layers"], "rank_timeout": dist["rank_timeout"]}
