"""Teacher routing traces for head distillation: corpus windows -> sharded .npz files on disk.

A shard holds whole windows (sequences of `seq_len` tokens), per MoE layer:
  hidden (n, L, S, d) float16   post-attention-norm hidden entering the sparse block
  topk   (n, L, S, k) int16     executed experts (ascending)
  logits (n, L, S, E) float32   router logits (the distillation target)
  tokens (n, S)       int32
Training rows are derived, not duplicated: the head of MoE layer a at token t reads
hidden[a, t], topk[a, t], topk[a, t-1] (none at t=0) and is trained towards logits[b, t+1],
b = the next MoE layer (wrapping to the first for the last layer). Layer-horizon heads
(`lead=0`) read the same inputs and are trained towards logits[b, t], the same token's next
MoE layer, without wrap-around. See `head_rows`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import mlx.nn as nn
import numpy as np
from tqdm import tqdm

from edge0.errors import ConfigError
from edge0.log import get_logger
from edge0.routing.prerouter import block_top_k, moe_blocks, router_weight
from edge0.train.capture import run_and_record
from edge0.train.rows import take

log = get_logger(__name__)
META_FILE = "traces.json"
NO_EXPERT = -1  # padding index: multi_hot() maps it to an all-zero row


def corpus_text(path: str | Path, split: str = "train") -> str:
    """Text of a corpus: a file, or `<dir>/<split>.txt` (tools/build_corpus.py output)."""
    p = Path(path)
    if p.is_dir():
        p = p / f"{split}.txt"
    if not p.is_file():
        raise ConfigError(f"{p}: corpus text not found; pass a .txt file or a corpus directory")
    return p.read_text(encoding="utf-8")


def text_encoder(tokenizer: Any) -> Any:
    """str -> token ids without special tokens; the `tokenizers` backend when there is one
    (transformers warns about any text longer than the model's context)."""
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is not None:
        return lambda text: backend.encode(text, add_special_tokens=False).ids
    return tokenizer.encode


def sample_windows(text: str, encode: Any, n: int, seq_len: int) -> np.ndarray:
    """(n, seq_len) int32 token windows taken at evenly spaced places in `text` (deterministic)."""
    span = seq_len * 5  # chars; code runs ~3.5-4 chars per BPE token (grown when short)
    if len(text) < span * 2:
        raise ConfigError(f"corpus has {len(text)} chars, too short for {seq_len}-token windows")
    out = np.empty((n, seq_len), dtype=np.int32)
    step = (len(text) - span * 2) / max(1, n)
    for i in range(n):
        start = int(i * step)
        ids = list(encode(text[start : start + span]))[1:]  # drop a partial first token
        grow = span
        while len(ids) < seq_len:
            grow *= 2
            ids = list(encode(text[start : start + grow]))[1:]
        out[i] = ids[:seq_len]
    return out


def corpus_windows(corpus: str | Path, split: str, encode: Any, n: int, length: int) -> np.ndarray:
    """(max(1, n), length) token windows of a corpus split (`corpus_text`, `sample_windows`)."""
    return sample_windows(corpus_text(corpus, split), encode, max(1, n), length)


@attrs.frozen
class TraceMeta:
    moe_layers: tuple[int, ...]
    d_model: int
    num_experts: int
    top_k: int
    seq_len: int
    windows: int
    shards: tuple[str, ...]
    source: str  # "teacher" or "student-int4" (where the hidden/topk inputs came from)
    model: str

    def write(self, out: Path) -> None:
        d = attrs.asdict(self)
        (out / META_FILE).write_text(json.dumps(d, indent=2) + "\n")

    @classmethod
    def read(cls, out: Path) -> TraceMeta:
        p = out / META_FILE
        if not p.is_file():
            raise ConfigError(f"{out}: no {META_FILE}; collect traces with `edge0 train traces`")
        d = json.loads(p.read_text())
        d["moe_layers"], d["shards"] = tuple(d["moe_layers"]), tuple(d["shards"])
        return cls(**d)


def collect(
    teacher: nn.Module,
    windows: np.ndarray,
    out: Path,
    *,
    student: nn.Module | None = None,
    batch: int = 4,
    shard_windows: int = 64,
    model_name: str = "",
    progress: bool = True,
) -> TraceMeta:
    """Run `teacher` (and `student`, when given, for the inputs) over windows; write shards.

    Memory holds one shard at a time. With a student, hidden/topk come from the student
    path and the target logits from the teacher.
    """
    out.mkdir(parents=True, exist_ok=True)
    blocks = moe_blocks(teacher)
    e, d = router_weight(blocks[0][1]).shape
    n, seq_len = windows.shape
    shards: list[str] = []
    pending: list[dict[str, np.ndarray]] = []
    on_tty = None if progress else True  # tqdm's None: only on a terminal
    bar = tqdm(total=n * seq_len, unit="tok", desc="traces", disable=on_tty)
    for lo in range(0, n, batch):
        toks = windows[lo : lo + batch]
        t = run_and_record(teacher, mx.array(toks), np.dtype(np.float16))
        src = (
            t if student is None else run_and_record(student, mx.array(toks), np.dtype(np.float16))
        )
        pending.append({"hidden": src.hidden, "topk": src.topk, "logits": t.logits, "tokens": toks})
        bar.update(toks.size)
        if sum(len(p["tokens"]) for p in pending) >= shard_windows or lo + batch >= n:
            name = f"shard-{len(shards):05d}.npz"
            arrays: dict[str, Any] = {
                k: np.concatenate([p[k] for p in pending]) for k in pending[0]
            }
            np.savez(out / name, **arrays)
            shards.append(name)
            log.info(
                "traces.shard", file=str(out / name), windows=sum(len(p["tokens"]) for p in pending)
            )
            pending = []
    bar.close()
    meta = TraceMeta(
        moe_layers=tuple(i for i, _ in blocks),
        d_model=int(d),
        num_experts=int(e),
        top_k=block_top_k(blocks[0][1]),
        seq_len=seq_len,
        windows=n,
        shards=tuple(shards),
        source="teacher" if student is None else "student-int4",
        model=model_name,
    )
    meta.write(out)
    return meta


@attrs.define
class TraceSet:
    """All shards of a trace directory in memory: arrays (n, L, S, ...) as in the module doc."""

    meta: TraceMeta
    hidden: np.ndarray
    topk: np.ndarray
    logits: np.ndarray

    @classmethod
    def load(cls, out: str | Path) -> TraceSet:
        out = Path(out)
        meta = TraceMeta.read(out)
        parts: dict[str, list[np.ndarray]] = {"hidden": [], "topk": [], "logits": []}
        for name in meta.shards:
            with np.load(out / name) as z:
                for k in parts:
                    parts[k].append(z[k])
        return cls(meta, *(np.concatenate(parts[k]) for k in ("hidden", "topk", "logits")))

    def pairs(self, wrap: bool = True) -> list[tuple[int, int]]:
        """(owner, target) positions along the MoE-layer axis, as PrerouterConfig.heads()."""
        n = len(self.meta.moe_layers)
        out = [(a, a + 1) for a in range(n - 1)]
        return out + [(n - 1, 0)] if wrap else out


def horizon_lead(horizon: str) -> int:
    """Tokens between a head's input and its target: 1 for "token", 0 for "layer"."""
    return {"token": 1, "layer": 0}[horizon]


def head_rows(
    ts: TraceSet, seqs: np.ndarray, pos: np.ndarray, owner: int, target: int, lead: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows (window seqs[i], token pos[i]) for one head; pos in [0, seq_len - 1 - lead].

    Returns hidden (R, d) f32, topk_t (R, k), topk_prev (R, k) (NO_EXPERT at t=0),
    target logits (R, E) = router logits of MoE layer `target` at token pos + lead.
    """
    if lead not in (0, 1):
        raise ValueError(f"lead {lead} is not 0 (layer horizon) or 1 (token horizon)")
    hidden = take(ts.hidden, seqs, owner, pos).astype(np.float32)
    topk_t = take(ts.topk, seqs, owner, pos).astype(np.int32)
    prev = take(ts.topk, seqs, owner, np.maximum(pos - 1, 0)).astype(np.int32)
    prev[pos == 0] = NO_EXPERT
    return hidden, topk_t, prev, take(ts.logits, seqs, target, pos + lead)
