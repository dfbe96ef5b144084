"""Run the hostile inputs of docs/reliability.md against `edge0` and print the outcome table.

Builds a tiny checkpoint, then tries each case (a CLI command, or a short Python
snippet) in a fresh process and prints one markdown row per case: the command, the
exit code, and the first line of stderr (or of stdout when stderr is empty).

    .venv/bin/python tools/hostile.py > hostile.md
    .venv/bin/python tools/hostile.py --code-dir /path/to/old/checkout   # another version
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import click

EDGE0 = [sys.executable, "-c", "from edge0.cli.main import main; main()"]
KEPT = """
import asyncio, sys
from edge0.runtime.engine.api import Engine
async def main():
    async with Engine.open(sys.argv[1], mode="route", tiers="pread") as eng:
        kept = eng.tokens([5, 17, 42], max_tokens=50, stop=False)
        await kept.__anext__()  # walk away, keeping the generator
        ids = await asyncio.wait_for(_all(eng.tokens([5, 17, 42], max_tokens=4)), 60)
        print("second request done:", len(ids), "tokens")
async def _all(agen):
    return [t async for t in agen]
asyncio.run(main())
"""
SEEDED = """
import asyncio, sys
from edge0.model.generate import SamplingSettings
from edge0.runtime.engine.api import Engine
async def ids(mode):
    async with Engine.open(sys.argv[1], mode=mode, tiers="pread") as eng:
        s = SamplingSettings(temp=1.5, seed=7)
        return [t async for t in eng.tokens([5, 17, 42], max_tokens=8, sampling=s, stop=False)]
a, b = asyncio.run(ids("hint")), asyncio.run(ids("resident"))
print("same tokens" if a == b else f"different: {a} vs {b}")
"""


def edit_json(path: Path, fn: Callable[[dict], None]) -> None:
    d = json.loads(path.read_text())
    fn(d)
    path.write_text(json.dumps(d))


def field_shape(d: dict) -> None:
    d["fields"][0]["shape"] = [1, 2, 3]


def header_length(path: Path) -> None:
    raw = path.read_bytes()
    path.write_bytes(struct.pack("<Q", 2**62) + raw[8:])


def flip_record_byte(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    path.write_bytes(bytes(raw))


CODE_DIR: str | None = None  # run the cases with the edge0 found here (`python -c` puts cwd first)


def run(cmd: list[str], stdin: bytes | None = None) -> tuple[int, str]:
    proc = subprocess.run(cmd, input=stdin, capture_output=True, timeout=600, cwd=CODE_DIR)
    err, out = proc.stderr.decode(errors="replace"), proc.stdout.decode(errors="replace")
    lines = [ln for ln in err.splitlines() if ln.strip() and "PyTorch was not found" not in ln]
    errors = [ln for ln in lines if ln.startswith(("edge0: error:", "Error:"))]
    if errors:
        first = errors[-1]
    elif proc.returncode == 0:
        first = (out.strip().splitlines() or [""])[-1]
    else:
        first = lines[-1] if lines else ""
    tb = " (traceback)" if "Traceback" in err else ""
    return proc.returncode, first[:160] + tb


def _break_link(path: Path) -> None:
    """`path` becomes a link to a file that no longer exists (a model cache entry deleted)."""
    path.unlink()
    path.symlink_to(path.parent / "deleted-blob")


def _fsize_limit() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))


def damaged(store: Path, root: Path, name: str, fn: Callable[[Path], None]) -> Path:
    copy = root / name
    shutil.copytree(store, copy)
    fn(copy)
    return copy


@click.command()
@click.option("--keep", is_flag=True, help="Keep the scratch directory.")
@click.option("--code-dir", default=None, help="Run the cases with the edge0 package in this dir.")
def main(keep: bool, code_dir: str | None) -> None:
    global CODE_DIR
    CODE_DIR = code_dir
    from edge0.layout.convert import ConvertOptions, convert
    from edge0.synth.tiny import TinySpec, write_checkpoint

    root = Path(tempfile.mkdtemp(prefix="edge0-hostile-"))
    src = write_checkpoint(TinySpec(model_type="qwen3_moe"), root / "src")
    store = root / "e0"
    convert(src, store, ConvertOptions(group_size=32))
    man = "edge0.json"
    (root / "mine").mkdir()
    (root / "mine" / "thesis.txt").write_text("years of work")
    left = root / "e0b.tmp-abcd1234"
    left.mkdir()
    (left / "experts.bin").write_bytes(b"\0" * 4096)
    rows: list[tuple[str, list[str], bytes | None, Callable[[], str] | None, list[str]]] = []

    def case(
        label: str,
        args: list[str],
        stdin: bytes | None = None,
        after: Callable[[], str] | None = None,
        prefix: list[str] | None = None,
    ) -> None:
        rows.append((label, args, stdin, after, prefix or []))

    def isolated(n: int) -> Path:  # a copy per destructive case (old versions deleted SRC)
        copy = root / f"iso{n}" / "src"
        shutil.copytree(src, copy)
        return copy

    before = sorted(f.name for f in src.iterdir())

    def intact(p: Path) -> Callable[[], str]:  # SRC still holds exactly its own files
        def check() -> str:
            now = sorted(f.name for f in p.iterdir()) if p.is_dir() else []
            extra = sorted(set(now) - set(before))
            if set(before) <= set(now):
                return "SRC intact" + (f" (plus {extra})" if extra else "")
            return "SRC REPLACED by the output" if "edge0.json" in now else "SRC DELETED"

        return check

    e = ["run", str(store), "-p", "hi", "--max-tokens", "4"]
    s1, s2, s3, s4 = (isolated(n) for n in range(4))
    (root / "link").symlink_to(s4)
    g = ["--group-size", "32"]  # the tiny experts are 32 wide
    case("convert SRC SRC --force", ["convert", str(s1), str(s1), "--force", *g], after=intact(s1))
    case("convert SRC SRC/out", ["convert", str(s2), str(s2 / "out"), *g], after=intact(s2))
    case(
        "convert SRC PARENT --force",
        ["convert", str(s3), str(s3.parent), "--force", *g],
        after=intact(s3),
    )
    case(
        "convert SRC LINK-TO-SRC --force",
        ["convert", str(s4), str(root / "link"), "--force", *g],
        after=intact(s4),
    )
    thesis = root / "mine" / "thesis.txt"
    case(
        "convert SRC NON-EDGE0-DIR --force",
        ["convert", str(src), str(root / "mine"), "--force", *g],
        after=lambda: "thesis kept" if thesis.exists() else "THESIS LOST",
    )
    case(
        "convert after a killed convert (DST.tmp-* left)",
        ["convert", str(src), str(root / "e0b"), *g],
        after=lambda: "leftover removed" if not left.exists() else "LEFTOVER KEPT",
    )
    case("convert --bits 0", ["convert", str(src), str(root / "b0"), "--bits", "0"])
    case("convert --bits 8", ["convert", str(src), str(root / "b8"), "--bits", "8", *g])
    case("convert --group-size 48", ["convert", str(src), str(root / "g"), "--group-size", "48"])
    case("convert (experts 32 wide, default group 64)", ["convert", str(src), str(root / "g64")])
    case("run -p - < invalid UTF-8", [*e[:2], "-p", "-"], stdin=b"caf\xe9 \xff")
    case("run --memory-budget 1e400", [*e, "--memory-budget", "1e400"])
    case("run --tiers 'ram:1e400>pread'", [*e, "--tiers", "ram:1e400>pread"])
    case("run --trace /missing/t.json", [*e, "--trace", "/missing-e0/t.json"])
    case("edge0 --log-json /missing/l.jsonl run", ["--log-json", "/missing-e0/l.jsonl", *e])
    case("run --temp nan", [*e, "--temp", "nan"])
    case("run --top-p inf", [*e, "--top-p", "inf"])
    case("run --mode resident --tiers pread", [*e, "--mode", "resident", "--tiers", "pread"])
    # second round: serve's options, unreadable files, --io-workers
    case("run --io-workers 1000", [*e, "--io-workers", "1000"])
    for flag, value in (("--max-body", "abc"), ("--max-body", "-1"), ("--max-body", "1e400")):
        case(f"serve {flag} {value}", ["serve", str(store), "--port", "0", flag, value])
    for flag in ("--trace", "--log-json"):  # MODEL is no layout: old versions refused that first
        case(f"serve {flag} /missing/f", ["serve", str(root / "mine"), flag, "/missing-e0/f"])
    denied = damaged(store, root, "denied", lambda p: None)
    for p in [root, denied, *denied.iterdir()]:
        p.chmod(0o777 if p.is_dir() else 0o644)
    (denied / "experts.bin").chmod(0)
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    as_user = nobody if os.geteuid() == 0 else []  # root reads anything
    case("verify: experts.bin permission denied", ["verify", str(denied)], prefix=as_user)
    case("run: experts.bin permission denied", ["run", str(denied), "-p", "hi"], prefix=as_user)
    linked = damaged(store, root, "linked", lambda p: _break_link(p / "tokenizer.json"))
    case("run: tokenizer.json a broken link", ["run", str(linked), "-p", "hi"])
    src_link = root / "src-link"
    shutil.copytree(src, src_link)
    _break_link(src_link / "tokenizer.json")
    out_link = root / "out-link"
    case(
        "convert: SRC tokenizer.json a broken link",
        ["convert", str(src_link), str(out_link), *g],
        after=lambda: (
            "DST not written"
            if not out_link.exists()
            else "DST has tokenizer.json"
            if (out_link / "tokenizer.json").exists()
            else "DST WRITTEN WITHOUT tokenizer.json"
        ),
    )
    bad = {
        "edge0.json quantization.group_size 0": lambda p: edit_json(
            p / man, lambda d: d["quantization"].update(group_size=0)
        ),
        "edge0.json quantization.bits 8 (int4 records)": lambda p: edit_json(
            p / man, lambda d: d["quantization"].update(bits=8)
        ),
        "edge0.json n_experts null": lambda p: edit_json(
            p / man, lambda d: d.update(n_experts=None)
        ),
        "edge0.json record_size a list": lambda p: edit_json(
            p / man, lambda d: d.update(record_size=[1])
        ),
        "edge0.json fields[0].shape [1,2,3]": lambda p: edit_json(p / man, field_shape),
        "edge0.json fields[1].dtype int7": lambda p: edit_json(
            p / man, lambda d: d["fields"][1].update(dtype="int7")
        ),
        "edge0.json fields[2].offset +64": lambda p: edit_json(
            p / man, lambda d: d["fields"][2].update(offset=d["fields"][2]["offset"] + 64)
        ),
        "resident.safetensors header length 2**62": lambda p: header_length(
            p / "resident.safetensors"
        ),
        "experts.bin one flipped bit": lambda p: flip_record_byte(p / "experts.bin"),
    }
    for label, fn in bad.items():
        d = damaged(store, root, f"case{len(rows)}", fn)
        case(f"verify: {label}", ["verify", str(d)])
        case(f"run: {label}", ["run", str(d), "-p", "hi", "--max-tokens", "4"])

    print("| case | exit | first line of output | after |")
    print("|---|---|---|---|")
    for label, args, stdin, after, prefix in rows:
        rc, line = run([*prefix, *EDGE0, *args], stdin)
        tail = after() if after else ""
        print(f"| `{label}` | {rc} | {line.replace('|', '/')} | {tail} |")
    for label, code in (
        ("abandoned stream kept by reference, then a 2nd request", KEPT),
        ("same seed, hint vs resident", SEEDED),
    ):
        rc, line = run([sys.executable, "-c", code, str(store)])
        print(f"| `{label}` (Python API) | {rc} | {line.replace('|', '/')} | |")
    # a write that fails mid-convert: RLIMIT_FSIZE makes writes past 64 KiB fail (EFBIG)
    # (the up-front free-space check makes a real ENOSPC need another writer filling the disk)
    out = root / "fsize"
    proc = subprocess.run(
        [*EDGE0, "convert", str(src), str(out), "--group-size", "32"],
        capture_output=True,
        timeout=600,
        preexec_fn=_fsize_limit,
        cwd=CODE_DIR,
    )
    err = [ln for ln in proc.stderr.decode().splitlines() if "PyTorch" not in ln and ln.strip()]
    left_over = sorted(p.name for p in root.iterdir() if p.name.startswith("fsize"))
    print(
        f"| `convert, writes fail past 64 KiB (ulimit -f)` | {proc.returncode} | "
        f"{(err or [''])[0][:160]} | left: {left_over or 'nothing'} |"
    )
    if not keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
