"""Run a command inside a memory-capped cgroup (page cache included) and report what it used.

    sudo python tools/memcap.py --limit 3GiB [--json out.json] -- edge0 run MODEL -p hi ...

Creates a cgroup with the limit (cgroup v1 `memory` controller, or cgroup v2 with
the memory controller enabled), starts the command in it, samples the cgroup's
usage, and prints: exit status, the cgroup's peak usage (anonymous memory and page
cache together, as the kernel charges them), the largest page cache seen, the
number of times the limit was hit, OOM kills, and the peak RSS: the largest VmHWM
of any process in the cgroup (sampled from /proc, and the command's own read just
before it is reaped), so a wrapper such as `/usr/bin/time -v CMD` still reports
CMD's peak, not the wrapper's. Needs root and a writable
cgroup hierarchy; anything else is a one-line error (exit 2).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edge0.bench.cgroup import CapError, largest_hwm, run_capped  # noqa: E402, F401
from edge0.storage.spec import parse_size  # noqa: E402

_MIB = 1 << 20


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--limit", required=True, help="Memory cap, page cache included, e.g. 3GiB.")
@click.option("--interval", default=0.2, show_default=True, help="Seconds between samples.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def main(limit: str, interval: float, json_out: str | None, command: tuple[str, ...]) -> None:
    """Run COMMAND with its memory (anonymous + page cache) capped at LIMIT."""
    try:
        try:
            cap = parse_size(limit)
        except ValueError as exc:
            raise CapError(f"--limit: {exc}") from None
        out = run_capped(list(command), cap, interval)
    except CapError as exc:
        click.echo(f"memcap: error: {exc}", err=True)
        sys.exit(2)
    click.echo(
        f"memcap: limit {cap / _MIB:.0f} MiB ({out['cgroup']}): exit {out['exit']} after "
        f"{out['seconds']:.1f} s; cgroup peak {out['peak_usage'] / _MIB:.0f} MiB (RSS + page "
        f"cache), page cache up to {out['peak_page_cache'] / _MIB:.0f} MiB, limit hit "
        f"{out['limit_hits']} times, OOM kills {out['oom_kills']}; command peak RSS "
        f"{out['peak_rss'] / _MIB:.0f} MiB",
        err=True,
    )
    if json_out:
        Path(json_out).write_text(json.dumps(out, indent=1) + "\n")
    sys.exit(out["exit"] if out["exit"] >= 0 else 128 - out["exit"])


if __name__ == "__main__":
    main()
