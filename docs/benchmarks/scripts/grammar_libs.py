"""Grammar libraries side by side: llguidance, xgrammar, outlines-core on one large vocabulary.

For each library and JSON schema: the time to compile the schema, the CPU time per
token to compute the next-token mask and advance the matcher along a valid answer
(median over the answer's tokens, per round), and whether the schema compiles at all
(coverage). The tokenizer is a byte-level BPE trained here on the running Python's
standard library (`--vocab` tokens, 150,000 by default; a few minutes to train, cached
in `--tokenizer`), the size of the vocabularies of the Qwen, GLM and DeepSeek families.

Needs the three libraries (`pip install llguidance xgrammar outlines-core`); xgrammar
needs torch. Writes one JSON file.

Run: python docs/benchmarks/scripts/grammar_libs.py --out docs/benchmarks/results/grammar-libs.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import numpy as np

SCHEMAS: dict[str, dict[str, Any]] = {
    "object": {"type": "object"},
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "email": {"type": "string", "format": "email"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": False,
    },
    "bounds": {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 1, "maximum": 999},
            "x": {"type": "number", "exclusiveMinimum": 0},
            "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
            "short": {"type": "string", "minLength": 2, "maxLength": 5},
        },
        "required": ["n", "x", "code", "short"],
        "additionalProperties": False,
    },
    "nested_anyof_enum": {
        "type": "object",
        "properties": {
            "kind": {"enum": ["a", "b"]},
            "value": {"anyOf": [{"type": "integer"}, {"type": "string"}, {"type": "null"}]},
            "items": {
                "type": "array",
                "minItems": 1,
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {"id": {"type": "integer"}},
                    "required": ["id"],
                },
            },
        },
        "required": ["kind", "value", "items"],
        "additionalProperties": False,
    },
    "refs": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "v": {"type": "integer"},
                    "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]},
                },
                "required": ["v", "next"],
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/node",
    },
    "oneof_const": {
        "oneOf": [
            {
                "type": "object",
                "properties": {"t": {"const": "x"}, "x": {"type": "integer"}},
                "required": ["t", "x"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "properties": {"t": {"const": "y"}, "y": {"type": "string"}},
                "required": ["t", "y"],
                "additionalProperties": False,
            },
        ],
    },
}
ANSWERS = {
    "object": {"a": 1, "b": [True, None], "c": "text"},
    "person": {
        "name": "Ada Lovelace",
        "age": 36,
        "email": "ada@example.org",
        "tags": ["math", "engines"],
    },
    "bounds": {"n": 42, "x": 3.5, "code": "ABC-1234", "short": "hey"},
    "nested_anyof_enum": {"kind": "a", "value": "seven", "items": [{"id": 1}, {"id": 2}]},
    "refs": {"v": 1, "next": {"v": 2, "next": None}},
    "oneof_const": {"t": "y", "y": "why"},
}


def train_tokenizer(path: Path, vocab: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    files = sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))

    def texts() -> Any:
        for f in files:
            try:
                yield f.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts(), trainer)
    tok.save(str(path))


def hf_tokenizer(path: Path) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(path), eos_token="<|endoftext|>")


class Llguidance:
    name = "llguidance"

    def __init__(self, hf: Any, vocab: int) -> None:
        import llguidance.hf

        self.tok = llguidance.hf.from_tokenizer(hf, n_vocab=vocab)
        self.bits = np.zeros((vocab + 31) // 32, dtype=np.int32)

    def compile(self, schema: dict[str, Any]) -> Any:
        import llguidance

        style = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=style)
        m = llguidance.LLMatcher(self.tok, grammar, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def step(self, m: Any, token: int) -> None:
        m.unsafe_compute_mask_ptr(self.bits.ctypes.data, self.bits.nbytes)
        assert (self.bits[token >> 5] >> (token & 31)) & 1, "token not allowed"
        assert m.consume_token(token), m.get_error()


class Xgrammar:
    name = "xgrammar"

    def __init__(self, hf: Any, vocab: int) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab)
        self.compiler = xgr.GrammarCompiler(info, cache_enabled=False)
        self.bits = xgr.allocate_token_bitmask(1, vocab)

    def compile(self, schema: dict[str, Any]) -> Any:
        compiled = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
        return self.xgr.GrammarMatcher(compiled)

    def step(self, m: Any, token: int) -> None:
        m.fill_next_token_bitmask(self.bits)
        assert m.accept_token(token), "token not accepted"


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, hf: Any, vocab: int) -> None:
        from outlines_core import Vocabulary

        byte_of = {c: b for b, c in _bytes_to_unicode().items()}
        eos = hf.eos_token_id
        tokens: dict[bytes, list[int]] = {}
        for text, i in hf.get_vocab().items():
            if i != eos:
                tokens.setdefault(bytes(byte_of[c] for c in text), []).append(i)
        self.vocab = Vocabulary(eos, tokens)
        self.n = vocab
        self.mask = np.zeros((vocab + 31) // 32, dtype=np.uint32)

    def compile(self, schema: dict[str, Any]) -> Any:
        from outlines_core import Guide, Index
        from outlines_core.json_schema import build_regex_from_schema

        regex = build_regex_from_schema(json.dumps(schema), whitespace_pattern=" ?")
        return Guide(Index(regex, self.vocab))

    def step(self, g: Any, token: int) -> None:
        g.write_mask_into(self.mask.ctypes.data, self.mask.size, self.mask.itemsize)
        assert (int(self.mask[token >> 5]) >> (token & 31)) & 1, "token not allowed"
        g.advance(token)


def _bytes_to_unicode() -> dict[int, str]:
    """The byte-level BPE alphabet: byte -> the printable character that stands for it."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def run(lib: Any, hf: Any, rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, schema in SCHEMAS.items():
        text = json.dumps(ANSWERS[name])  # separators ", " and ": "
        ids = hf.encode(text, add_special_tokens=False)
        try:
            t0 = time.process_time()
            lib.compile(schema)
            compile_s = time.process_time() - t0
        except Exception as exc:  # noqa: BLE001 - coverage: the schema is not supported
            out[name] = {"compiles": False, "error": f"{type(exc).__name__}: {exc}"[:200]}
            continue
        per_round = []
        try:
            for _ in range(rounds):
                m = lib.compile(schema)
                times = []
                for t in ids:
                    t0 = time.process_time()
                    lib.step(m, t)
                    times.append(time.process_time() - t0)
                per_round.append(statistics.median(times) * 1e6)
        except AssertionError as exc:
            out[name] = {"compiles": True, "follows": False, "error": str(exc)[:200]}
            continue
        out[name] = {
            "compiles": True,
            "follows": True,
            "compile_ms": compile_s * 1e3,
            "tokens": len(ids),
            "us_per_token_rounds": per_round,
            "us_per_token_median": statistics.median(per_round),
        }
    return out


LIBS = {c.name: c for c in (Llguidance, Xgrammar, OutlinesCore)}


def one(name: str, tokenizer: Path, rounds: int) -> dict[str, Any]:
    hf = hf_tokenizer(tokenizer)
    t0 = time.perf_counter()
    lib = LIBS[name](hf, len(hf))
    return {"tokenizer_setup_s": time.perf_counter() - t0, "schemas": run(lib, hf, rounds)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=150_000)
    ap.add_argument("--tokenizer", type=Path, default=Path("grammar-bench-tokenizer.json"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--budget", type=float, default=240.0, help="seconds per library")
    ap.add_argument("--lib", choices=list(LIBS), help=argparse.SUPPRESS)  # a child run
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.lib:
        args.out.write_text(json.dumps(one(args.lib, args.tokenizer, args.rounds)))
        return
    if not args.tokenizer.exists():
        train_tokenizer(args.tokenizer, args.vocab)
    results: dict[str, Any] = {
        "vocab": len(hf_tokenizer(args.tokenizer)),
        "load_before": Path("/proc/loadavg").read_text().split()[:3],
    }
    for name in LIBS:  # each in a child process under a time budget
        part = args.out.with_suffix(f".{name}.part")
        cmd = [
            sys.executable,
            __file__,
            "--lib",
            name,
            "--tokenizer",
            str(args.tokenizer),
            "--rounds",
            str(args.rounds),
            "--out",
            str(part),
        ]
        try:
            subprocess.run(cmd, check=True, timeout=args.budget)
            results[name] = json.loads(part.read_text())
        except subprocess.TimeoutExpired:
            results[name] = {"error": f"not done within {args.budget:.0f} s"}
        except subprocess.CalledProcessError as exc:
            results[name] = {"error": f"exit code {exc.returncode}"}
        part.unlink(missing_ok=True)
        print(name, json.dumps(results[name])[:300], flush=True)
    results["load_after"] = Path("/proc/loadavg").read_text().split()[:3]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
