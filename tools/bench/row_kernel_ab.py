"""A row-kernel change measured against a base revision: the same unit built twice, interleaved.

    python tools/bench/row_kernel_ab.py --base REV [--isa avx2] [--case mxfp4:2880x2880:32]
        [--m 1,4] [--footprint 1,256] [--rounds 11] [--stretch 256] [--opt 3]
        [--int8] [--json OUT]

Compiles `edge0/kernels/src/isa_ISA.cpp` from git revision REV and from the working tree
(each with the flags its own CMakeLists.txt gives that unit), links both into
tools/bench/row_kernel_ab.cpp, and runs every case: KIND:ROWSxCOLS:GROUP (KIND a4, a8 or
mxfp4) at each M and footprint. A footprint of 1 MiB keeps the matrix in cache (the
kernel's compute); 256 MiB of copies makes every call read DRAM, as a decode step does.
For each case it prints both builds' GB of weights per CPU-second of the calling thread
(medians over rounds, the two builds alternating first), the per-round ratio new/base
(median and range), the largest relative difference between their outputs, and the load
average. `--int8` times the int8-input path (EDGE0_INT8_ACTIVATIONS) of both builds
instead, x quantized once for both (4-bit cases only). The JSON names the sources each
side was built from (a digest of the unit, kernel_impl.h and kernel.h). No MLX involved:
this is the kernel alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

ROOT = Path(__file__).resolve().parents[2]
SRC = "edge0/kernels/src"
DRIVER = ROOT / "tools" / "bench" / "row_kernel_ab.cpp"
DEFAULT_CASES = ("a4:2048x4096:64", "a4:512x2048:64", "a4:2048x1024:64", "mxfp4:2880x2880:32")


def unit_flags(cmake: str, isa: str) -> list[str]:
    """The flags `edge0_isa(ISA -m...)` gives that unit in a CMakeLists.txt's text."""
    for name, flags in re.findall(r"edge0_isa\((\w+)((?: -m[\w-]+)*)\)", cmake):
        if name == isa:
            return flags.split()
    raise click.ClickException(f"CMakeLists.txt has no edge0_isa({isa} ...) unit")


def parse_case(text: str) -> tuple[str, int, int, int]:
    m = re.fullmatch(r"(a4|a8|mxfp4):(\d+)x(\d+):(\d+)", text)
    if m is None:
        raise click.BadParameter(f"{text!r}: expected KIND:ROWSxCOLS:GROUP, e.g. a4:2048x4096:64")
    kind, rows, cols, group = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
    if group not in (32, 64, 128) or cols % group or (kind == "mxfp4" and group != 32):
        raise click.BadParameter(
            f"{text!r}: group must be 32, 64 or 128 (mxfp4: 32) and divide COLS"
        )
    return kind, rows, cols, group


def source_digest(kernels: Path, isa: str) -> str:
    """sha256 of what one side is compiled from: the unit, kernel_impl.h and kernel.h."""
    h = hashlib.sha256()
    for name in (f"isa_{isa}.cpp", "kernel_impl.h", "kernel.h"):
        h.update(name.encode() + b"\0" + (kernels / "src" / name).read_bytes() + b"\0")
    return h.hexdigest()


def _tree_at(rev: str, dest: Path) -> Path:
    """edge0/kernels at `rev`, extracted under dest."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "edge0/kernels"], capture_output=True
    )
    if archive.returncode != 0:
        raise click.ClickException(f"git archive {rev}: {archive.stderr.decode().strip()}")
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def _compile(kernels: Path, isa: str, entry: str, out: Path, opt: int) -> Path:
    flags = unit_flags((kernels / "CMakeLists.txt").read_text(), isa)
    obj = out / f"{entry}.o"
    cmd = [
        "g++",
        f"-O{opt}",
        "-fno-math-errno",
        "-ffp-contract=off",  # as CMakeLists.txt builds every unit
        "-std=c++20",
        f"-I{kernels / 'src'}",
        *flags,
        f"-Dkernels_{isa}={entry}",
        "-c",
        str(kernels / "src" / f"isa_{isa}.cpp"),
        "-o",
        str(obj),
    ]
    subprocess.run(cmd, check=True)
    return obj


class Build:
    """The driver, and what it was built from."""

    def __init__(self, exe: Path, base_perm: bool, base_q8: bool, digests: tuple[str, str]):
        self.exe = exe
        self.base_perm = base_perm  # the base's Kernels table has fp4_perm
        self.base_q8 = base_q8  # ... and rows_q8 (the driver must not read them otherwise)
        self.digests = digests  # source_digest of the base and of the working tree


def build(base: str, isa: str, work: Path, opt: int = 3) -> Build:
    """The driver linked with `isa`'s unit at `base` and in the working tree."""
    old = _tree_at(base, work / "base") / "edge0" / "kernels"
    new = ROOT / "edge0" / "kernels"
    objs = [
        _compile(old, isa, "edge0_ab_base", work, opt),
        _compile(new, isa, "edge0_ab_new", work, opt),
    ]
    if (old / "src" / "kernel.h").read_text() != (new / "src" / "kernel.h").read_text():
        click.echo(
            "note: kernel.h differs at the base; the driver uses the working tree's", err=True
        )
    base_h = (old / "src" / "kernel.h").read_text()
    exe = work / "row_kernel_ab"
    subprocess.run(
        [
            "g++",
            "-O2",
            "-std=c++20",
            f"-I{ROOT / SRC}",
            str(DRIVER),
            str(ROOT / SRC / "inputs.cpp"),  # the layout of x, as the extension builds it
            *map(str, objs),
            "-o",
            str(exe),
        ],
        check=True,
    )
    digests = (source_digest(old, isa), source_digest(new, isa))
    return Build(exe, "fp4_perm" in base_h, "rows_q8" in base_h, digests)


def _line(r: dict[str, Any]) -> str:
    return (
        f"{r['kind']}{' int8' if r['int8'] else ''} {r['rows']}x{r['cols']} g{r['group']} "
        f"M={r['m']} {r['footprint_mib']} MiB: "
        f"base {r['base_gb_per_cpu_s']:.2f}, new {r['new_gb_per_cpu_s']:.2f} GB/cpu-s; "
        f"new/base {r['ratio_median']:.3f} [{r['ratio_min']:.3f}..{r['ratio_max']:.3f}], "
        f"max rel diff {r['max_rel_diff']:.2g}, load {r['load'][0]:.1f} -> {r['load'][1]:.1f}"
    )


@click.command()
@click.option("--base", required=True, help="git revision to compare the working tree against")
@click.option("--isa", default="avx2", show_default=True, help="avx2, avx512, neon or portable")
@click.option("--case", "cases", multiple=True, help="KIND:ROWSxCOLS:GROUP (repeatable)")
@click.option("--m", "ms", default="1,4", show_default=True, help="input rows per call")
@click.option(
    "--footprint",
    "footprints",
    default="1,256",
    show_default=True,
    help="MiB of matrix copies visited per pass: 1 stays in cache, 256 reads DRAM",
)
@click.option("--rounds", default=11, show_default=True)
@click.option("--stretch", default=256, show_default=True, help="MiB of weights per timed stretch")
@click.option(
    "--opt", default=3, show_default=True, help="-O level of both units (3: as installed)"
)
@click.option("--int8", is_flag=True, help="time the int8-input path (4-bit cases only)")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None)
def main(
    base: str,
    isa: str,
    cases: tuple[str, ...],
    ms: str,
    footprints: str,
    rounds: int,
    stretch: int,
    opt: int,
    int8: bool,
    json_out: Path | None,
) -> None:
    parsed = [parse_case(c) for c in (cases or DEFAULT_CASES)]
    if int8 and any(kind == "a8" for kind, *_ in parsed):
        raise click.BadParameter("int8 inputs meet 4-bit matrices only: drop the a8 cases")
    m_list = [int(v) for v in ms.split(",")]
    f_list = [int(v) for v in footprints.split(",")]
    results = []
    with tempfile.TemporaryDirectory(prefix="edge0-row-ab-") as tmp:
        b = build(base, isa, Path(tmp), opt)
        if int8 and not b.base_q8:
            raise click.ClickException(f"{base} has no int8-input path to compare with")
        for kind, rows, cols, group in parsed:
            for m in m_list:
                for mib in f_list:
                    load0 = os.getloadavg()[0]
                    args = [kind, rows, cols, group, m, mib, rounds, stretch]
                    args += [int(b.base_perm), int(int8)]
                    got = subprocess.run(
                        [str(b.exe), *map(str, args)], capture_output=True, text=True
                    )
                    if got.returncode:
                        raise click.ClickException(f"the driver: {got.stderr.strip()}")
                    row = json.loads(got.stdout)
                    row |= {"footprint_mib": mib, "load": [load0, os.getloadavg()[0]]}
                    results.append(row)
                    click.echo(_line(row))
    if json_out is not None:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", base], capture_output=True, text=True
        )
        doc = {
            "base": base,
            "base_commit": commit.stdout.strip(),
            "isa": isa,
            "int8": int8,
            "base_sources": b.digests[0],
            "new_sources": b.digests[1],
            "rounds": rounds,
            "stretch_mib": stretch,
            "results": results,
        }
        json_out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    sys.exit(main())
