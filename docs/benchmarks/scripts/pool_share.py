"""Run an `edge0` command with the in-graph route policy's slot pool capped, in this process.

`available-first` (in the graph) grows the slot pool into a device-side cache
(`edge0.runtime.layers.policy_graph.POOL_EXTRA_BYTES` beyond the usual K x (L + 2)
slots): on the demo that is 144 slots for 224 routed experts (64% staged), while a
flagship under `--memory-budget` holds a few percent of its experts in slots.
This wrapper sets the growth to `--extra-mib` (0: the usual pool only) and runs
the rest of the command line as `edge0 ...`, so a policy is measured at the staged
share its target will have. `edge0 bench run` needs `--isolate process` here (its
subprocesses would not see the cap).

Usage: pool_share.py --extra-mib 0 -- eval quality M CORPUS ...
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[0] != "--extra-mib" or "--" not in argv:
        sys.exit(__doc__.strip().splitlines()[-1])
    extra = int(float(argv[1]) * (1 << 20))
    rest = argv[argv.index("--") + 1 :]
    from edge0.runtime.layers import policy_graph

    policy_graph.POOL_EXTRA_BYTES = extra
    from edge0.cli.main import main as edge0_main

    sys.argv = ["edge0", *rest]
    edge0_main()


if __name__ == "__main__":
    main(sys.argv[1:])
