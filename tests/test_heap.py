"""glibc's mmap threshold stays fixed: multi-MiB blocks are mapped on their own."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# After a 16 MiB block is freed, glibc's dynamic threshold rises to 16 MiB and a 2 MiB
# block comes from the arena; with the threshold fixed it is mapped on its own (mallinfo2's
# hblkhd counts mapped bytes). Prints the growth of mapped bytes for the 2 MiB block.
SCRIPT = textwrap.dedent("""
    import ctypes, sys
    from edge0.heap import fix_mmap_threshold

    class M(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                    "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = M
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    if sys.argv[1] == "fixed":
        assert fix_mmap_threshold()
    big = libc.malloc(16 << 20)
    libc.free(big)
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(2 << 20)
    print(libc.mallinfo2().hblkhd - before)
    libc.free(block)
""")


def _mapped_growth(variant: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, variant], env=env, capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and mallinfo2")
def test_a_fixed_threshold_maps_a_block_that_the_dynamic_one_keeps_in_the_arena() -> None:
    assert _mapped_growth("dynamic") == 0  # the control: glibc's default raised its threshold
    assert _mapped_growth("fixed") >= 2 << 20


def test_a_threshold_given_in_the_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    from edge0 import heap

    monkeypatch.setattr(heap, "_done", False)
    monkeypatch.setenv(heap.ENV, "65536")
    assert heap.fix_mmap_threshold() is False


# Six threads each allocate; glibc gives each its own arena unless `limit_arenas` capped their
# number. Prints the number of heaps malloc_info reports, then whether trim() ran.
ARENAS = textwrap.dedent("""
    import ctypes, re, sys, tempfile, threading
    from edge0 import heap

    if sys.argv[1] == "limited":
        assert heap.limit_arenas(2)
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = (ctypes.c_size_t,)
    libc.fopen.restype = ctypes.c_void_p
    libc.malloc_info.argtypes = (ctypes.c_int, ctypes.c_void_p)
    libc.fclose.argtypes = (ctypes.c_void_p,)
    gate = threading.Barrier(6)
    def work():
        gate.wait()  # all at once: each finds the others' arenas busy
        for _ in range(200):
            libc.malloc(4096)
    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads: t.start()
    for t in threads: t.join()
    path = tempfile.NamedTemporaryFile(delete=False).name
    fp = libc.fopen(path.encode(), b"w")
    libc.malloc_info(0, fp)
    libc.fclose(fp)
    print(len(re.findall(r'<heap nr="\\d+">', open(path).read())), heap.trim())
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and malloc_info")
def test_limit_arenas_caps_the_arenas_threads_get_and_trim_runs() -> None:
    def heaps(variant: str) -> tuple[int, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
        env["PYTHONPATH"] = str(ROOT)
        out = subprocess.run(
            [sys.executable, "-c", ARENAS, variant], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        count, trimmed = out.stdout.split()[-2:]
        return int(count), trimmed

    assert heaps("default")[0] > 2  # the control: a thread, an arena
    count, trimmed = heaps("limited")
    assert count <= 2 and trimmed == "True"
