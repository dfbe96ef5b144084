"""The row kernels alone, every variant against a double-precision reference (no MLX).

Compiles tests/native/kernel_selftest.cpp with the kernels' sources for this machine (the
x86 variants it can run) and, where an AArch64 cross compiler and qemu are installed,
for AArch64 to run the NEON variant under emulation.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "edge0" / "kernels" / "src"
TEST = ROOT / "tests" / "native" / "kernel_selftest.cpp"
COMMON = ["compute.cpp", "inputs.cpp", "pool.cpp", "dispatch.cpp", "isa_portable.cpp"]


def _isa_flags() -> dict[str, list[str]]:
    """Each x86 unit's flags as CMakeLists.txt gives them (`edge0_isa(avx2 -mavx2 ...)`)."""
    cmake = (ROOT / "edge0" / "kernels" / "CMakeLists.txt").read_text()
    units = dict(
        (f"isa_{name}.cpp", flags.split())
        for name, flags in re.findall(r"edge0_isa\((\w+)((?: -m[\w-]+)*)\)", cmake)
    )
    return {name: units[name] for name in ("isa_avx2.cpp", "isa_avx512.cpp")}


X86 = _isa_flags()


def _build(cxx: str, out: Path, isa: dict[str, list[str]], extra: list[str]) -> None:
    """The ISA units and the rest compile side by side (the units are the slow part)."""
    objs, jobs = [], []
    for name, flags in isa.items():
        obj = out.with_name(name + ".o")
        jobs.append(subprocess.Popen([cxx, "-O2", "-std=c++20", f"-I{SRC}", "-c", str(SRC / name),
                                      *flags, "-o", str(obj)]))  # fmt: skip
        objs.append(str(obj))
    main = out.with_name("selftest-main.o")
    jobs.append(subprocess.Popen([cxx, "-O2", "-std=c++20", f"-I{SRC}", "-c", str(TEST),
                                  "-o", str(main)]))  # fmt: skip
    codes = [job.wait() for job in jobs]
    assert codes == [0] * len(jobs), f"{cxx} failed: exit codes {codes}"
    cmd = [cxx, "-O2", "-std=c++20", f"-I{SRC}", str(main), *(str(SRC / f) for f in COMMON),
           *objs, "-pthread", *extra, "-o", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True)


def _check(run: list[str]) -> str:
    got = subprocess.run(run, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stdout + got.stderr
    return got.stdout


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
def test_host_variants_match_the_reference(tmp_path: Path) -> None:
    x86 = platform.machine() in ("x86_64", "AMD64")
    _build("g++", tmp_path / "selftest", X86 if x86 else {}, [])
    out = _check([str(tmp_path / "selftest")])
    assert "portable:" in out
    if x86:
        assert "avx2:" in out or "avx2" not in _cpu_flags()


@pytest.mark.skipif(
    shutil.which("aarch64-linux-gnu-g++") is None or shutil.which("qemu-aarch64") is None,
    reason="no AArch64 cross compiler and qemu-aarch64 (apt: g++-aarch64-linux-gnu qemu-user)",
)
def test_neon_variant_matches_the_reference_under_qemu(tmp_path: Path) -> None:
    _build("aarch64-linux-gnu-g++", tmp_path / "selftest", {"isa_neon.cpp": []}, ["-static"])
    out = _check(["qemu-aarch64", str(tmp_path / "selftest")])
    assert "neon:" in out and "portable:" in out


def _cpu_flags() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
