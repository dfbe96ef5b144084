"""llama.cpp beside Edge0 (through llama-cpp-python, when installed): prompt and decode tok/s
of a GGUF file, in this process or as `python -m edge0.bench.llama_peer` inside a cgroup."""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

TEXT = b"The river carried small boats of grain down to the market town."


def missing(gguf: Path | None) -> str | None:
    """Why there can be no llama.cpp figure (one line), or None when there can."""
    try:
        import llama_cpp  # noqa: F401, PLC0415
    except ImportError:
        return (
            "llama-cpp-python is not installed: no llama.cpp figures (pip install llama-cpp-python)"
        )
    if gguf is None:
        return "no --gguf given: no llama.cpp figures"
    if not gguf.is_file():
        return f"--gguf {gguf}: no such file"
    return None


def _open(gguf: Path, threads: int, n_ctx: int, n_batch: int, repack: bool = True) -> Any:
    import llama_cpp  # noqa: PLC0415

    with _repacking(repack):
        return llama_cpp.Llama(
            model_path=str(gguf),
            n_threads=threads,
            n_threads_batch=threads,
            n_batch=n_batch,
            n_ctx=n_ctx,
            verbose=False,
        )


@contextlib.contextmanager
def _repacking(on: bool) -> Iterator[None]:
    """llama.cpp's load-time weight repacking (its CPU "extra buffer types") on or off.

    On (llama.cpp's default) the CPU backend copies the weights it repacks out of the file
    mapping into anonymous memory; off, they stay file-backed page cache the kernel can
    reclaim, which a memory cap smaller than the model needs. llama-cpp-python's `Llama` takes
    no argument for it, so its default model parameters are wrapped while it loads.
    """
    import llama_cpp.llama_cpp as api  # noqa: PLC0415

    default = api.llama_model_default_params

    def params() -> Any:
        p = default()
        p.use_extra_bufts = on
        return p

    api.llama_model_default_params = params
    try:
        yield
    finally:
        api.llama_model_default_params = default


def _prompt_ids(llm: Any, prompt_len: int) -> list[int]:
    ids = llm.tokenize(TEXT)
    return (ids * (prompt_len // max(1, len(ids)) + 1))[:prompt_len]


def prompt(gguf: Path, prompt_len: int, rounds: int, threads: int = 1) -> dict[str, Any]:
    """Prompt tok/s of `rounds` evaluations of a `prompt_len`-token prompt."""
    llm = _open(gguf, threads, prompt_len + 16, prompt_len)
    ids = _prompt_ids(llm, prompt_len)
    tps = []
    for _ in range(rounds):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        tps.append(prompt_len / (time.perf_counter() - t0))
    return {"gguf": str(gguf), "threads": threads, "prompt_tps": tps}


def decode(
    gguf: Path,
    prompt_len: int,
    tokens: int,
    prompts: int,
    threads: int = 1,
    warmup: int = 4,
    repack: bool = True,
) -> dict[str, Any]:
    """Greedy decode tok/s: `prompts` requests of `tokens` tokens after a `prompt_len`-token
    prompt, one token a step (llama.cpp's own sampler: the argmax), after a short warm-up."""
    n_ctx = prompt_len + tokens + warmup + 8
    llm = _open(gguf, threads, n_ctx, max(prompt_len, 8), repack)
    ids = _prompt_ids(llm, prompt_len)
    _generate(llm, ids, warmup)  # page in what a step reads, as Edge0's warm-up request does
    runs = []
    for _ in range(prompts):
        t0 = time.perf_counter()
        got = _generate(llm, ids, tokens)
        runs.append({**got, "wall_s": time.perf_counter() - t0})
    return {
        "gguf": str(gguf),
        "threads": threads,
        "repack": repack,
        "runs": runs,
        "decode_tps": statistics.median(r["decode_tps"] for r in runs),
        "prompt_tps": statistics.median(r["prompt_tps"] for r in runs),
    }


def _generate(llm: Any, ids: list[int], tokens: int) -> dict[str, Any]:
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    t1 = time.perf_counter()
    out = []
    for _ in range(tokens):
        tok = int(llm.sample(temp=0.0))
        out.append(tok)
        llm.eval([tok])
    t2 = time.perf_counter()
    return {
        "tokens": out,
        "prompt_tps": len(ids) / (t1 - t0),
        "decode_tps": tokens / (t2 - t1) if tokens else 0.0,
    }


@attrs.frozen
class Peer:
    """llama.cpp beside Edge0 in a benchmark: the same model as a GGUF file."""

    gguf: Path
    threads: int = 1
    repack: bool = True  # llama.cpp's load-time weight repacking (off inside a memory cap)

    label = "llama.cpp"

    def command(self, out: Path, prompt_len: int, tokens: int, prompts: int) -> list[str]:
        """`decode` as a process of its own, writing its figures to `out` (JSON)."""
        return [
            *(sys.executable, "-m", "edge0.bench.llama_peer", str(self.gguf), "--json", str(out)),
            *("--prompt-len", str(prompt_len), "--tokens", str(tokens)),
            *("--prompts", str(prompts), "--threads", str(self.threads)),
            *(() if self.repack else ("--no-repack",)),
        ]

    def decode(self, prompt_len: int, tokens: int, prompts: int, timeout_s: float) -> dict:
        """`decode` in a process of its own (as each Edge0 variant runs): figures, or an error."""
        with tempfile.TemporaryDirectory(prefix="edge0-llama-") as tmp:
            out = Path(tmp) / "out.json"
            cmd = self.command(out, prompt_len, tokens, prompts)
            try:
                got = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                return {"error": f"llama.cpp did not finish within {timeout_s:g} s"}
            if got.returncode != 0 or not out.exists():
                tail = (got.stderr or got.stdout).strip().splitlines()[-2:]
                return {"error": " | ".join(tail) or f"exit {got.returncode}"}
            result: dict[str, Any] = json.loads(out.read_text())
            return result


def main(argv: list[str] | None = None) -> int:
    """`python -m edge0.bench.llama_peer GGUF --json OUT ...`: one decode measurement."""
    ap = argparse.ArgumentParser(prog="python -m edge0.bench.llama_peer")
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-repack", action="store_true", help="weights stay in the file mapping")
    args = ap.parse_args(argv)
    why = missing(args.gguf)
    if why is not None:
        print(why, file=sys.stderr)  # noqa: T201 - a command's one line
        return 2
    repack = not args.no_repack
    got = decode(args.gguf, args.prompt_len, args.tokens, args.prompts, args.threads, repack=repack)
    args.json.write_text(json.dumps(got))
    return 0


if __name__ == "__main__":
    sys.exit(main())
