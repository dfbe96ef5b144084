"""The demo model's teacher as a Q4_0 GGUF file, for llama.cpp beside Edge0 (`--gguf`).

    python docs/benchmarks/scripts/demo_gguf.py LLAMA_CPP_DIR OUT.gguf

LLAMA_CPP_DIR is a llama.cpp source tree (its `convert_hf_to_gguf.py`, `conversion/` and
`gguf-py/`; llama-cpp-python's source archive carries one under `vendor/llama.cpp`). Needs
torch (the `train` extra) for the converter and llama-cpp-python for the quantization.

The demo's tokenizer is its own byte-level BPE, whose pre-tokenizer llama.cpp's converter
does not list; it is written as llama.cpp's "default" pre-tokenizer. Only the speed of the
two engines is compared on this file, never their text.
"""

from __future__ import annotations

import runpy
import sys
import tempfile
from pathlib import Path

from edge0.model.demo import teacher_path


def convert(llama_cpp: Path, out_f16: Path) -> None:
    """The bf16 teacher as an f16 GGUF file, through llama.cpp's own converter."""
    sys.path[:0] = [str(llama_cpp), str(llama_cpp / "gguf-py")]
    import conversion.base as base  # type: ignore[import-not-found]  # noqa: PLC0415

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "default"
    script = llama_cpp / "convert_hf_to_gguf.py"
    argv = [str(script), str(teacher_path()), "--outtype", "f16", "--outfile", str(out_f16)]
    saved, sys.argv = sys.argv, argv
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = saved


def quantize(src: Path, dst: Path) -> None:
    """`src` requantized to Q4_0 (llama.cpp's own quantizer, through llama-cpp-python)."""
    import llama_cpp  # noqa: PLC0415

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0:
        raise SystemExit(f"llama.cpp's quantizer failed on {src} (rc {rc})")


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    llama_cpp, out = Path(sys.argv[1]), Path(sys.argv[2])
    with tempfile.TemporaryDirectory(prefix="edge0-gguf-") as tmp:
        f16 = Path(tmp) / "demo-f16.gguf"
        convert(llama_cpp, f16)
        quantize(f16, out)
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB, Q4_0)")  # noqa: T201


if __name__ == "__main__":
    main()
