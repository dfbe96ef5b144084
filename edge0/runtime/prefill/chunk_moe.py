"""A streamed MoE layer over a prompt chunk: its union of experts staged in groups, one scheduler
sub-step each (docs/runtime.md, "Prompt processing", step 3).
"""

from __future__ import annotations

import time
from typing import Protocol

import mlx.core as mx
import numpy as np

from edge0.kernels.native import module
from edge0.kernels.ops import expert_ffn_runs
from edge0.layout.records import projection_quant
from edge0.runtime.layers.block import StreamingMoE, expert_ffn, ffn_plan
from edge0.runtime.layers.streams import ResidentExperts
from edge0.runtime.prefill.dense import DENSE_MAX_BYTES, on_cpu


class Chunk(Protocol):
    """What a layer's expert groups use of their chunk (edge0.runtime.prefill.chunks.ChunkState)."""

    following: dict[int, StreamingMoE]  # layer -> the next streamed block
    predicted: dict[int, list[int]]  # layer -> its predicted union
    ahead: dict[int, list[int]]  # layer -> experts read early

    def check(self) -> None: ...

    def substep(self) -> None: ...

    def prefetch(self, layer: int, experts: list[int], ahead: int = 1) -> None: ...

    def acquire(self, layer: int, experts: list[int]) -> list[int]: ...

    def decode_set(self, layer: int) -> list[int] | None: ...


DENSE_EXPERT_ROWS = 4  # rows from which an expert's weights are dequantized (prefill.md); 0: never


def run_pairs(
    block: StreamingMoE, views: dict[str, mx.array], h: mx.array, idx: mx.array
) -> mx.array:
    """SwiGLU of each row of `h` (P, 1, d) with expert slot `idx` (P,) sorted; (P, 1, d)."""
    return expert_ffn(block, views, h, idx, sorted_indices=True)


def dense_expert(
    block: StreamingMoE, views: dict[str, mx.array], slot: int, h: mx.array
) -> mx.array:
    """The gated FFN of rows `h` (R, d) with the expert in `slot`, its weights dequantized
    once: on the CPU backend int4 kernels unpack the weight again per row (prefill.dense)."""
    quant = block.stream.quant

    def proj(name: str, inp: mx.array) -> mx.array:
        q = projection_quant(quant, name)  # a projection may have its own bits
        biases = views.get(f"{name}.biases")
        scales = views[f"{name}.scales"][slot].astype(inp.dtype)
        w = mx.dequantize(
            views[f"{name}.weight"][slot],
            scales,
            None if biases is None else biases[slot].astype(inp.dtype),
            group_size=q["group_size"],
            bits=q["bits"],
        )
        out = inp @ w.T
        bias = views.get(f"{name}.bias")
        return out if bias is None else out + bias[slot]

    return proj("down_proj", block.activation(proj("up_proj", h), proj("gate_proj", h)))


def dense_experts_ok(block: StreamingMoE) -> bool:
    """Whether this layer's experts may run dequantized: affine records on the CPU backend
    that the native expert FFN does not run (its GEMM decodes each weight row once for all
    of an expert's rows: faster), each projection's fp32 weight within DENSE_MAX_BYTES (a
    wider one, e.g. experts of 4096-5120 x 8192-14336, keeps the int4 kernel: its
    dequantized copy would be more memory than the plan's prompt chunk holds)."""
    quant = block.stream.quant
    if not (DENSE_EXPERT_ROWS > 0 and on_cpu() and quant.get("mode", "affine") == "affine"):
        return False
    views = block.stream.views
    for name in ("gate_proj", "up_proj", "down_proj"):
        out, packed = views[f"{name}.weight"].shape[-2:]
        if out * packed * (32 // int(projection_quant(quant, name)["bits"])) * 4 > DENSE_MAX_BYTES:
            return False
    return module() is None or not expert_ffn_runs(*ffn_plan(quant, views), block.activation)


def group_pairs(
    block: StreamingMoE, x2: mx.array, rows: np.ndarray, pairs: np.ndarray, slot_ids: np.ndarray
) -> tuple[np.ndarray, mx.array]:
    """Outputs (P, d) of the (token, expert) `pairs` (sorted by slot; token `rows`, slot
    `slot_ids`) and the pair order they come in: an expert with DENSE_EXPERT_ROWS rows or more
    runs dequantized (affine records), the others in one sorted gather_qmm."""
    views = block.stream.views
    if not dense_experts_ok(block):  # the native expert op, or every expert few-rowed
        h = x2[mx.array(rows)][:, None, :]  # (P, 1, d)
        return pairs, run_pairs(block, views, h, mx.array(slot_ids)).squeeze(1)
    slots, counts = np.unique(slot_ids, return_counts=True)
    dense = slots[counts >= DENSE_EXPERT_ROWS]
    few = ~np.isin(slot_ids, dense)
    parts, outs = [], []
    if few.any():
        h = x2[mx.array(rows[few])][:, None, :]  # (P', 1, d)
        outs.append(run_pairs(block, views, h, mx.array(slot_ids[few])).squeeze(1))
        parts.append(pairs[few])
    for s in dense.tolist():
        sel = slot_ids == s
        outs.append(dense_expert(block, views, s, x2[mx.array(rows[sel])]))
        parts.append(pairs[sel])
    out = mx.concatenate(outs, axis=0) if len(outs) > 1 else outs[0]
    return np.concatenate(parts), out


def slot_pairs(
    slot_of: dict[int, int], by_expert: np.ndarray, starts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The pairs routed to the experts of `slot_of` (expert -> its slot), sorted by slot (the
    sorted indices gather_qmm wants; one slot's pairs in token order), and their slots.
    `by_expert`: every pair index sorted by expert; expert e's are [starts[e], starts[e+1])."""
    placed = sorted((s, e) for e, s in slot_of.items())
    parts = [by_expert[starts[e] : starts[e + 1]] for _, e in placed]
    slots = np.repeat(np.asarray([s for s, _ in placed], np.uint32), [len(p) for p in parts])
    return np.concatenate(parts), slots


def stage_order(
    union: list[int], last: list[int] | None, early: list[int] | None = None
) -> list[int]:
    """The union with the experts read `early` first and those named in `last` at the end
    (they stay staged for decode: the end wins over `early`)."""
    tail = set(last or [])
    head = [e for e in early or [] if e in set(union) and e not in tail]
    rest = [e for e in union if e not in set(head)]
    return head + [e for e in rest if e not in tail] + [e for e in rest if e in tail]


def read_ahead(block: StreamingMoE, g: int, st: Chunk) -> None:
    """Stage the next streamed layer's predicted first group (`g` experts) for this sub-step
    of chunk `st`: its layer computes next, at the same step; the reads overlap the compute
    until then."""
    nxt = st.following.get(block.stream.layer)
    if nxt is None or nxt.layer not in st.predicted:
        return
    keep = set(st.decode_set(nxt.layer) or [])  # staged last there, for the first decode step
    early = [e for e in st.predicted.pop(nxt.layer) if e not in keep][:g]
    st.ahead[nxt.layer] = early
    st.prefetch(nxt.layer, early, ahead=0)


def group_size(n_slots: int, layers: int, top_k: int) -> int:
    """Experts staged per sub-step: G with 2G + K x (layers - 1) <= n_slots, at least 1.

    The slot pool is shared by all streamed layers. While one layer stages its
    chunk, every other streamed layer may hold up to K slots (its experts staged
    for a step ahead); this layer needs its current group and the next one's
    prefetch at once. Within that bound a group can always be staged, so the
    pool is never over capacity (K x (layers + 2) slots give G = 3K/2).
    """
    return max(1, (n_slots - top_k * (layers - 1)) // 2)


def chunk_experts(block: StreamingMoE, x: mx.array, inds: np.ndarray, st: Chunk) -> mx.array:
    """Routed-expert outputs (1, T, K, d) of chunk `st`'s `x` (1, T, d), or (1, T, K, d) with
    an input per expert, for routing `inds` (T, K)."""
    stream = block.stream
    steps, layer = stream.steps, stream.layer
    t, k = inds.shape
    flat = inds.reshape(-1)  # (T*K,) pair p = (token p // K, slot p % K)
    x2 = x.reshape(-1, x.shape[-1])  # (T, d), or (T*K, d): an input per expert (Llama-4)
    per_pair = x.ndim == 4
    resident = isinstance(stream.experts, ResidentExperts)
    memory = steps.memory  # None: every layer resident, nothing is read
    assert memory is not None or resident
    g = group_size(memory.n_slots, len(memory.views), stream.top_k) if memory else 0
    if resident:  # every expert in memory: one sorted gather over all pairs
        groups = [sorted(set(flat.tolist()))]
        if memory is not None:
            read_ahead(block, g, st)
    else:
        early = st.ahead.pop(layer, None)
        union = stage_order(sorted(set(flat.tolist())), st.decode_set(layer), early)
        groups = [union[i : i + g] for i in range(0, len(union), g)]
    by_expert = np.argsort(flat, kind="stable")  # pair indices by expert, in token order
    starts = np.concatenate(([0], np.cumsum(np.bincount(flat))))
    pair_parts: list[np.ndarray] = []
    out_parts: list[mx.array] = []
    for j, group in enumerate(groups):
        if resident:
            slot_of = {e: e for e in group}
        else:
            if j > 0:
                st.check()  # a cancelled request stops between two groups
                st.substep()  # group j-1 is evaluated: its slots may be rewritten from here on
            if j + 1 < len(groups):
                st.prefetch(layer, groups[j + 1])  # into the other half, for the next sub-step
            slot_of = dict(zip(group, st.acquire(layer, group), strict=True))
            if j + 1 == len(groups):
                read_ahead(block, g, st)  # the next layer's first group, into the other half
        pairs, slot_ids = slot_pairs(slot_of, by_expert, starts)
        pairs, out = group_pairs(block, x2, pairs if per_pair else pairs // k, pairs, slot_ids)
        t0, c0 = time.perf_counter(), time.thread_time()
        mx.eval(out)  # before the next sub-step: nothing pending may read these slots
        steps.span("eval", layer, t0, time.perf_counter(), time.thread_time() - c0)
        pair_parts.append(pairs)
        out_parts.append(out)
    pairs_all = np.concatenate(pair_parts)
    outs = mx.concatenate(out_parts, axis=0) if len(out_parts) > 1 else out_parts[0]
    back = mx.array(np.argsort(pairs_all, kind="stable").astype(np.uint32))
    return outs[back].reshape(1, t, k, x.shape[-1])  # (1, T, K, d) in (token, k) order
