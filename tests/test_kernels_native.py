"""The row kernels alone, every variant against a double-precision reference (no MLX).

Compiles tests/native/kernel_selftest.cpp with the kernels' sources for this machine (the
x86 variants it can run) and, where an AArch64 cross compiler and qemu are installed,
for AArch64 to run the NEON variant under emulation. The AVX-512 variant runs on a CPU
without AVX-512 too: its unit compiled over SIMDe's emulation of the intrinsics (the
`simde-py` package of the test extra), on AVX2.
"""

from __future__ import annotations

import concurrent.futures
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "edge0" / "kernels" / "src"
TEST = ROOT / "tests" / "native" / "kernel_selftest.cpp"
COMMON = ["compute.cpp", "inputs.cpp", "pool.cpp", "dispatch.cpp", "isa_portable.cpp"]
NEON_CXX = "aarch64-linux-gnu-g++"
X86_HOST = platform.machine() in ("x86_64", "AMD64")
Units = dict[str, list[str]]  # an ISA unit's source name -> its own flags


def _isa_flags() -> Units:
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


def _emulated_avx512() -> Units:
    """The x86 units with the AVX-512 one compiled over SIMDe on AVX2."""
    over_avx2 = [
        "-mavx2",
        "-mfma",
        f"-I{_simde()}",
        f"-I{TEST.parent}",
        "-DSIMDE_ENABLE_NATIVE_ALIASES",
        "-include",
        "simde_avx512.h",
        "-Wno-psabi",
    ]
    return {**X86, "isa_avx512.cpp": over_avx2}


Key = tuple[str, ...]  # (compiler, source, *flags)


class Objects:
    """The selftests' object files, each (compiler, source, flags) compiled once per module, on
    as many workers as there are CPUs (the units are the slow part): the host and emulated
    AVX-512 selftests share all but the AVX-512 unit, and a test waits only for its own."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pool = concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2)
        self.made: dict[Key, tuple[Path, concurrent.futures.Future[int]]] = {}

    def units(self, cxx: str, isa: Units) -> list[Key]:
        """The ISA units with CMakeLists.txt's flags and the rest, the slowest first."""
        plain = ("-O2", "-std=c++20", f"-I{SRC}")
        keys = [(cxx, str(SRC / n), *_common_flags(), *plain[1:], *f) for n, f in isa.items()]
        rest = sorted(COMMON, key=lambda n: not n.startswith("isa_"))  # the portable unit first
        keys += [(cxx, str(SRC / n), *plain, "-pthread") for n in rest]
        return [*keys, (cxx, str(TEST), *plain)]

    def start(self, cxx: str, isa: Units) -> None:
        for key in self.units(cxx, isa):
            if key not in self.made:
                obj = self.root / f"{len(self.made)}-{Path(key[1]).name}.o"
                cmd = [key[0], *key[2:], "-c", key[1], "-o", str(obj)]
                self.made[key] = obj, self.pool.submit(lambda c=cmd: subprocess.run(c).returncode)

    def build(self, cxx: str, out: Path, isa: Units, extra: list[str]) -> dict[str, Path]:
        """Link `out`; returns each unit's object by source name."""
        self.start(cxx, isa)
        keys = self.units(cxx, isa)
        codes = [self.made[key][1].result() for key in keys]
        assert codes == [0] * len(keys), f"{cxx} failed: exit codes {codes}"
        objs = {Path(key[1]).name: self.made[key][0] for key in keys}
        cmd = [cxx, "-O2", "-std=c++20", f"-I{SRC}", *map(str, objs.values()), "-pthread"]
        subprocess.run([*cmd, *extra, "-o", str(out)], check=True)
        return objs


# each selftest's compiler, whether it can run here, and its ISA units
BUILDS: dict[str, tuple[str, Callable[[], bool], Callable[[], Units]]] = {
    "test_host_variants_match_the_reference": (
        "g++",
        lambda: shutil.which("g++") is not None,
        lambda: X86 if X86_HOST else {},
    ),
    "test_neon_variant_matches_the_reference_under_qemu": (
        NEON_CXX,
        lambda: shutil.which(NEON_CXX) is not None and shutil.which("qemu-aarch64") is not None,
        lambda: {"isa_neon.cpp": []},
    ),
    "test_avx512_variant_matches_the_reference_over_an_emulation": (
        "g++",
        lambda: X86_HOST and shutil.which("g++") is not None and _simde() is not None,
        _emulated_avx512,
    ),
}


@pytest.fixture(scope="module")
def objects(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Objects]:
    """Every selected selftest's units queued at once: one test's link and run overlap the
    next one's compiles."""
    chosen = {i.originalname for i in request.session.items if i.module is request.module}
    objects = Objects(tmp_path_factory.mktemp("selftest-objects"))
    for name, (cxx, runs, units) in BUILDS.items():
        if name in chosen and runs():
            objects.start(cxx, units())
    yield objects
    objects.pool.shutdown(cancel_futures=True)


def _check(run: list[str]) -> str:
    got = subprocess.run(run, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stdout + got.stderr
    return got.stdout


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
def test_host_variants_match_the_reference(tmp_path: Path, objects: Objects) -> None:
    objects.build("g++", tmp_path / "selftest", X86 if X86_HOST else {}, [])
    out = _check([str(tmp_path / "selftest")])
    assert "portable:" in out
    assert re.search(r"^portable: \d+ many-row cases, each row's bits as alone", out, re.M)
    if X86_HOST:
        assert "avx2:" in out or "avx2" not in _cpu_flags()
        assert re.search(r"^avx2: \d+ int8-input cases", out, re.M) or "avx2" not in _cpu_flags()


@pytest.mark.skipif(
    shutil.which(NEON_CXX) is None or shutil.which("qemu-aarch64") is None,
    reason="no AArch64 cross compiler and qemu-aarch64 (apt: g++-aarch64-linux-gnu qemu-user)",
)
def test_neon_variant_matches_the_reference_under_qemu(tmp_path: Path, objects: Objects) -> None:
    objects.build(NEON_CXX, tmp_path / "selftest", {"isa_neon.cpp": []}, ["-static"])
    out = _check(["qemu-aarch64", str(tmp_path / "selftest")])
    assert "neon:" in out and "portable:" in out
    assert re.search(r"^neon: \d+ int8-input cases, the same bits as portable", out, re.M), out
    assert re.search(r"^neon: \d+ many-row cases, each row's bits as alone", out, re.M), out


@pytest.mark.skipif(
    not X86_HOST or shutil.which("g++") is None,
    reason="an x86-64 machine with a C++ compiler",
)
def test_avx512_variant_matches_the_reference_over_an_emulation(
    tmp_path: Path, objects: Objects
) -> None:
    """The AVX-512 unit's own source, each _mm512 intrinsic emulated by SIMDe on AVX2: the
    lanes, permutes and widenings it does run here even where the CPU has no AVX-512 (the
    real instructions then run only on such a CPU)."""
    if _simde() is None:
        pytest.skip("SIMDe's headers are not installed (pip install simde-py: the test extra)")
    if "avx2" not in _cpu_flags():
        pytest.skip("SIMDe's AVX-512 emulation is built on AVX2 here; this CPU lacks it")
    objs = objects.build("g++", tmp_path / "selftest", _emulated_avx512(), [])
    if shutil.which("objdump"):  # no AVX-512 register was used: this CPU can run the unit
        dump = subprocess.run(
            ["objdump", "-d", str(objs["isa_avx512.cpp"])],
            capture_output=True,
            text=True,
            check=True,
        )
        assert "%ymm" in dump.stdout and "%zmm" not in dump.stdout
    out = _check([str(tmp_path / "selftest"), "--emulated-avx512"])
    assert re.search(r"^avx512: \d+ cases", out, re.M), out
    assert re.search(r"^avx512: \d+ many-row cases, each row's bits as alone", out, re.M), out
