"""Fuzzed formats: a mutated checkpoint runs exactly as before or raises one Edge0Error.

Hypothesis mutates edge0.json (every key except model hyper-parameters that legitimately
change the model, e.g. rope_theta: only its shape keys), the resident.safetensors header
(length prefix, dtypes, shapes, offsets, raw bytes) and experts.bin (flipped bytes,
truncation, growth, swapped records). For each mutation `edge0 verify` and opening plus
generating (resident, and streaming for record damage) must each end in the reference
tokens or an Edge0Error: never another exception, a signal, or other tokens; and
whatever opening refuses, verify refuses too.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from runtime_helpers import PROMPT, build_store

from edge0.errors import Edge0Error
from edge0.layout.load import load_layout
from edge0.layout.manifest import EXPERTS_FILE, MANIFEST_FILE, RESIDENT_FILE
from edge0.layout.verify import verify
from edge0.model.generate import SamplingSettings, generate
from edge0.runtime.engine.api import Engine

EXAMPLES = 120
SHAPE_KEYS = (
    "hidden_size",
    "moe_intermediate_size",
    "num_experts",
    "num_hidden_layers",
    "vocab_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "model_type",
)
GREEDY4 = SamplingSettings(max_tokens=4)

VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.integers(-3, 3),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.just([]),
    st.just({}),
    st.lists(st.integers(0, 9), max_size=3),
)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    store = build_store(tmp_path_factory.mktemp("fuzz"), "qwen3_moe")
    return store, tokens_of(store)


def tokens_of(path: Path) -> list[int]:
    loaded = load_layout(path)
    return [p.token for p in generate(loaded, PROMPT, GREEDY4) if p.token is not None]


def manifest_paths(d: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = [prefix] if prefix else []
    if isinstance(d, dict):
        for k, v in d.items():
            if prefix == () and k == "config":
                out += [("config", key) for key in SHAPE_KEYS if key in v]
                continue
            out += manifest_paths(v, (*prefix, k))
    elif isinstance(d, list):
        picks = range(len(d)) if len(d) <= 12 else (0, 1, len(d) // 2, len(d) - 1)
        for i in picks:
            out += manifest_paths(d[i], (*prefix, i))
    return out


def set_path(d: Any, path: tuple[Any, ...], value: Any, delete: bool) -> None:
    for key in path[:-1]:
        d = d[key]
    if delete and isinstance(d, dict):
        del d[path[-1]]
    else:
        d[path[-1]] = value


def mutate_manifest(root: Path, data: st.DataObject) -> str:
    d = json.loads((root / MANIFEST_FILE).read_text())
    path = data.draw(st.sampled_from(manifest_paths(d)))
    old = d
    for key in path:
        old = old[key]
    near = st.integers(-2, 2).map(lambda k: old + k) if type(old) is int else VALUES
    value = data.draw(st.one_of(VALUES, near))
    delete = data.draw(st.booleans()) and data.draw(st.booleans())
    set_path(d, path, value, delete)
    (root / MANIFEST_FILE).write_text(json.dumps(d))
    return f"manifest {path} -> {'deleted' if delete else repr(value)[:40]}"


def mutate_header(root: Path, data: st.DataObject) -> str:
    f = root / RESIDENT_FILE
    raw = f.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header, body = json.loads(raw[8 : 8 + n]), raw[8 + n :]
    kind = data.draw(st.sampled_from(["length", "entry", "swap", "byte"]))
    names = sorted(k for k in header if k != "__metadata__")
    if kind == "length":
        n_new = data.draw(st.one_of(st.integers(0, 2**64 - 1), st.integers(n - 16, n + 16)))
        f.write_bytes(struct.pack("<Q", max(0, n_new) % 2**64) + raw[8:])
        return f"header length {n} -> {n_new}"
    if kind == "byte":
        i = data.draw(st.integers(8, 8 + n - 1))
        bit = 1 << data.draw(st.integers(0, 7))
        f.write_bytes(raw[:i] + bytes([raw[i] ^ bit]) + raw[i + 1 :])
        return f"header byte {i} ^ {bit}"
    name = data.draw(st.sampled_from(names))
    if kind == "swap":
        other = data.draw(st.sampled_from(names))
        a, b = header[name]["data_offsets"], header[other]["data_offsets"]
        header[name]["data_offsets"], header[other]["data_offsets"] = b, a
        what = f"swap offsets {name} <-> {other}"
    else:
        key = data.draw(st.sampled_from(["dtype", "shape", "data_offsets"]))
        choices = {
            "dtype": st.sampled_from(["F16", "BF16", "F32", "U32", "I8", "X9"]),
            "shape": st.lists(st.integers(-1, 300), max_size=3),
            "data_offsets": st.lists(st.integers(-5, 2**40), min_size=0, max_size=3),
        }
        value = data.draw(st.one_of(choices[key], VALUES))
        header[name][key] = value
        what = f"header {name}.{key} -> {repr(value)[:40]}"
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    f.write_bytes(struct.pack("<Q", len(blob)) + blob + body)
    return what


def mutate_records(root: Path, data: st.DataObject) -> str:
    f = root / EXPERTS_FILE
    raw = bytearray(f.read_bytes())
    kind = data.draw(st.sampled_from(["byte", "truncate", "grow", "swap"]))
    if kind == "byte":
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] ^= 1 << data.draw(st.integers(0, 7))
        what = f"experts byte {i}"
    elif kind == "truncate":
        k = data.draw(st.integers(1, len(raw)))
        del raw[len(raw) - k :]
        what = f"experts truncated by {k}"
    elif kind == "grow":
        raw += b"\0" * data.draw(st.integers(1, 20000))
        what = "experts grown"
    else:
        size = json.loads((root / MANIFEST_FILE).read_text())["record_size"]
        n = len(raw) // size
        a, b = data.draw(st.integers(0, n - 1)), data.draw(st.integers(0, n - 1))
        ra, rb = bytes(raw[a * size : (a + 1) * size]), bytes(raw[b * size : (b + 1) * size])
        raw[a * size : (a + 1) * size], raw[b * size : (b + 1) * size] = rb, ra
        what = f"records {a} <-> {b}"
    f.write_bytes(bytes(raw))
    return what


def outcome(fn: Any, path: Path) -> Any:
    """The function's result, or the Edge0Error it raised (anything else fails the test)."""
    try:
        return fn(path)
    except Edge0Error as exc:
        assert "\n" not in str(exc), f"not a one-line error: {exc!r}"
        return exc


SLOW_OK = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


@settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=SLOW_OK)
@given(data=st.data())
def test_every_mutation_is_a_correct_run_or_one_edge0_error(
    base: tuple[Path, list[int]], data: st.DataObject
) -> None:
    store, ref = base
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "e0"
        shutil.copytree(store, root)
        target = data.draw(st.sampled_from(["manifest", "header", "records"]))
        what = {"manifest": mutate_manifest, "header": mutate_header, "records": mutate_records}[
            target
        ](root, data)
        checked = outcome(lambda p: verify(p, progress=False), root)
        opened = outcome(tokens_of, root)
        event(f"{target}: open {'refused' if isinstance(opened, Edge0Error) else 'ran'}")
        if isinstance(opened, Edge0Error):
            assert isinstance(checked, Edge0Error), f"{what}: open refuses, verify says ok"
        else:
            assert opened == ref, f"{what}: other tokens without an error"
        if target == "records":
            streamed = outcome(stream_run, root)
            if not isinstance(streamed, Edge0Error):
                assert streamed == ref, f"{what}: streaming gave other tokens without an error"
                assert not isinstance(checked, Edge0Error) or isinstance(opened, Edge0Error)


def stream_run(path: Path) -> list[int]:
    async def main() -> list[int]:
        async with Engine.open(path, mode="reactive", tiers="pread") as eng:
            return [t async for t in eng.tokens(PROMPT, max_tokens=4)]

    return asyncio.run(main())
