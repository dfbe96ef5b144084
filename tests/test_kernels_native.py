"""The row kernels alone, every variant against a double-precision reference (no MLX).

Compiles tests/native/kernel_selftest.cpp with the kernels' sources for this machine (the
x86 variants it can run) and, where an AArch64 cross compiler and qemu are installed,
for AArch64 to run the NEON variant under emulation. The AVX-512 variant runs on a CPU
without AVX-512 too: its unit compiled over SIMDe's emulation of the intrinsics (the
`simde-py` package of the test extra), on AVX2.
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


def _common_flags() -> list[str]:
    """The flags CMakeLists.txt gives every ISA unit (`-O3 ... ${ARGN}`), at -O2: the selftest's
    units are compiled as the extension's are where it changes bits (-ffp-contract=off: no
    implicit fusion; GCC does not reassociate floats at any -O level), faster."""
    cmake = (ROOT / "edge0" / "kernels" / "CMakeLists.txt").read_text()
    found = re.search(r"edge0_isa_\$\{name\} PRIVATE ([^$]*)\$\{ARGN\}", cmake)
    assert found, "CMakeLists.txt: edge0_isa's compile options not found"
    return ["-O2" if f == "-O3" else f for f in found.group(1).split()]


def _build(cxx: str, out: Path, isa: dict[str, list[str]], extra: list[str]) -> None:
    """The ISA units and the rest compile side by side (the units are the slow part)."""
    objs, jobs = [], []
    for name, flags in isa.items():
        obj = out.with_name(name + ".o")
        jobs.append(
            subprocess.Popen(
                [
                    cxx,
                    *_common_flags(),
                    "-std=c++20",
                    f"-I{SRC}",
                    "-c",
                    str(SRC / name),
                    *flags,
                    "-o",
                    str(obj),
                ]
            )
        )
        objs.append(str(obj))
    main = out.with_name("selftest-main.o")
    jobs.append(
        subprocess.Popen([cxx, "-O2", "-std=c++20", f"-I{SRC}", "-c", str(TEST), "-o", str(main)])
    )
    codes = [job.wait() for job in jobs]
    assert codes == [0] * len(jobs), f"{cxx} failed: exit codes {codes}"
    cmd = [
        cxx,
        "-O2",
        "-std=c++20",
        f"-I{SRC}",
        str(main),
        *(str(SRC / f) for f in COMMON),
        *objs,
        "-pthread",
        *extra,
        "-o",
        str(out),
    ]
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
    assert re.search(r"^portable: \d+ many-row cases, each row's bits as alone", out, re.M)
    if x86:
        assert "avx2:" in out or "avx2" not in _cpu_flags()
        assert re.search(r"^avx2: \d+ int8-input cases", out, re.M) or "avx2" not in _cpu_flags()


@pytest.mark.skipif(
    shutil.which("aarch64-linux-gnu-g++") is None or shutil.which("qemu-aarch64") is None,
    reason="no AArch64 cross compiler and qemu-aarch64 (apt: g++-aarch64-linux-gnu qemu-user)",
)
def test_neon_variant_matches_the_reference_under_qemu(tmp_path: Path) -> None:
    _build("aarch64-linux-gnu-g++", tmp_path / "selftest", {"isa_neon.cpp": []}, ["-static"])
    out = _check(["qemu-aarch64", str(tmp_path / "selftest")])
    assert "neon:" in out and "portable:" in out
    assert re.search(r"^neon: \d+ int8-input cases, the same bits as portable", out, re.M), out
    assert re.search(r"^neon: \d+ many-row cases, each row's bits as alone", out, re.M), out


def _cpu_flags() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _simde() -> str | None:
    """The directory holding SIMDe's `simde/` headers, if the test extra installed them."""
    try:
        import simde_py
    except ImportError:
        return None
    got = Path(simde_py.get_include())
    return str(got) if (got / "simde" / "x86" / "avx512.h").is_file() else None


@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or shutil.which("g++") is None,
    reason="an x86-64 machine with a C++ compiler",
)
def test_avx512_variant_matches_the_reference_over_an_emulation(tmp_path: Path) -> None:
    """The AVX-512 unit's own source, each _mm512 intrinsic emulated by SIMDe on AVX2: the
    lanes, permutes and widenings it does run here even where the CPU has no AVX-512 (the
    real instructions then run only on such a CPU)."""
    include = _simde()
    if include is None:
        pytest.skip("SIMDe's headers are not installed (pip install simde-py: the test extra)")
    if "avx2" not in _cpu_flags():
        pytest.skip("SIMDe's AVX-512 emulation is built on AVX2 here; this CPU lacks it")
    over_avx2 = [
        "-mavx2",
        "-mfma",
        f"-I{include}",
        f"-I{TEST.parent}",
        "-DSIMDE_ENABLE_NATIVE_ALIASES",
        "-include",
        "simde_avx512.h",
        "-Wno-psabi",
    ]
    _build("g++", tmp_path / "selftest", {**X86, "isa_avx512.cpp": over_avx2}, [])
    if shutil.which("objdump"):  # no AVX-512 register was used: this CPU can run the unit
        dump = subprocess.run(
            ["objdump", "-d", str(tmp_path / "isa_avx512.cpp.o")],
            capture_output=True,
            text=True,
            check=True,
        )
        assert "%ymm" in dump.stdout and "%zmm" not in dump.stdout
    out = _check([str(tmp_path / "selftest"), "--emulated-avx512"])
    assert re.search(r"^avx512: \d+ cases", out, re.M), out
    assert re.search(r"^avx512: \d+ many-row cases, each row's bits as alone", out, re.M), out
