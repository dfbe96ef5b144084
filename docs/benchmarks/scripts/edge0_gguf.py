"""An Edge0 layout of the Qwen3.5-MoE family as a Q4_0 GGUF file, for llama.cpp beside Edge0.

    python docs/benchmarks/scripts/edge0_gguf.py LAYOUT OUT.gguf [--f32]

For the shapes that exist only as Edge0 layouts (`edge0 synth`), where llama.cpp's own
converter has no checkpoint to read. The file holds the layout's weights: every affine-quantized
matrix (experts and resident linears alike) dequantized (w = q * scale + bias per group) and
requantized to Q4_0 with gguf-py's port of llama.cpp's reference quantizer; the tensors that
`convert_hf_to_gguf.py` keeps in F32 (norms, router and shared-expert gate, conv1d, A, dt bias)
in F32. Names, shapes, the linear-attention value-head order and the metadata follow
`convert_hf_to_gguf.py`'s Qwen3.5-MoE model (llama.cpp as vendored by llama-cpp-python 0.3.36);
unlike `llama-quantize Q4_0`, the output matrix is Q4_0 too, as Edge0 holds it at int4.

Streams tensor by tensor, a resident matrix 8192 rows and a layer's experts 16 at a time, each
slice written as it is quantized: memory stays at a few hundred MiB (the 35B shape: 18.2 GiB
written in under 10 minutes on one core). Needs gguf-py (`pip install gguf`).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from edge0.layout.crc import crc32
from edge0.layout.manifest import EXPERTS_FILE, Manifest
from edge0.layout.records import VIEW_DTYPES as VIEWS
from edge0.layout.records import projection_quant
from edge0.layout.safetensors_io import read_header, read_raw

ARCH = "qwen35moe"
ROWS = 8192  # rows of a resident matrix dequantized at a time
EXPERTS = 16  # experts dequantized at a time
# the Split regex of Qwen3.5's tokenizer, which llama.cpp calls the "qwen35" pre-tokenizer
QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
F32_SUFFIXES = (
    "_norm.weight",
    ".ffn_gate_inp.weight",
    ".ffn_gate_inp_shexp.weight",
    ".ssm_conv1d.weight",
    ".ssm_a",
    ".ssm_dt.bias",
)
Chunks = Callable[[], Iterator[np.ndarray]]


def floats(raw: np.ndarray, dtype: str) -> np.ndarray:
    """A stored float tensor (bfloat16 as its uint16 bits) as float32."""
    if dtype == "bfloat16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32)


def dequantize(w: np.ndarray, scales: np.ndarray, biases: np.ndarray, bits: int) -> np.ndarray:
    """MLX's affine int format -> float32: (..., out, in*bits/32) uint32 -> (..., out, in)."""
    b = w.view(np.uint8)  # little-endian: element 0 in the low bits of byte 0
    if bits == 4:
        q = np.stack([b & 0x0F, b >> 4], axis=-1).reshape(*b.shape[:-1], -1)
    elif bits == 8:
        q = b
    else:
        raise SystemExit(f"{bits}-bit weights: only 4 and 8 bits are handled")
    n_groups = scales.shape[-1]
    q = q.reshape(*q.shape[:-1], n_groups, -1).astype(np.float32)
    out = q * scales[..., None] + biases[..., None]
    return out.reshape(*out.shape[:-2], -1)


def q4_0(x: np.ndarray) -> np.ndarray:
    import gguf  # noqa: PLC0415

    return gguf.quants.quantize(
        np.ascontiguousarray(x, dtype=np.float32), gguf.GGMLQuantizationType.Q4_0
    )


class Layout:
    """An Edge0 layout read as float32 tensors under their Hugging Face names."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.manifest = Manifest.load(path)
        if self.manifest.model_type != "qwen3_5_moe":
            raise SystemExit(f"{path}: model_type {self.manifest.model_type}, not qwen3_5_moe")
        if self.manifest.quantization.get("mode", "affine") != "affine":
            raise SystemExit(f"{path}: only affine-quantized layouts are handled")
        self.config = self.manifest.config
        self.text: dict[str, Any] = self.config.get("text_config", self.config)
        self.tensors = {
            k.removeprefix("language_model."): v
            for k, v in read_header(path / "resident.safetensors").items()
        }

    def quant(self, name: str) -> tuple[int, int]:
        """(bits, group size) of the resident linear `name` (its config override or the default)."""
        q = self.config.get("quantization") or self.manifest.quantization
        own = q.get(name) or q.get(f"language_model.{name}") or {}
        return int(own.get("bits", q["bits"])), int(own.get("group_size", q["group_size"]))

    def shape(self, name: str) -> tuple[int, ...]:
        if name + ".weight" in self.tensors and name + ".scales" in self.tensors:
            rows, packed = self.tensors[name + ".weight"].shape
            return rows, packed * 32 // self.quant(name)[0]
        return self.tensors[name].shape

    def read(self, name: str, rows: tuple[int, int] | None = None) -> np.ndarray:
        """Rows [a, b) of a resident tensor as float32 (a quantized linear dequantized)."""
        if name + ".scales" not in self.tensors:
            info = self.tensors[name]
            return floats(read_raw(info, rows), info.dtype)
        parts = [self.tensors[f"{name}.{p}"] for p in ("weight", "scales", "biases")]
        w, s, b = (read_raw(i, rows) for i in parts)
        return dequantize(
            w, floats(s, parts[1].dtype), floats(b, parts[2].dtype), self.quant(name)[0]
        )

    def experts(self, layer: int, lo: int, hi: int, proj: str) -> np.ndarray:
        """Projection `proj` of experts [lo, hi) of `layer` as float32 (hi - lo, out, in)."""
        m = self.manifest
        buf = np.empty((hi - lo, m.record_size), dtype=np.uint8)
        with open(self.path / EXPERTS_FILE, "rb", buffering=0) as fh:
            fh.seek(m.record_offset(layer, lo))
            if fh.readinto(buf.data) != buf.nbytes:
                raise SystemExit(f"{EXPERTS_FILE}: layer {layer} experts {lo}..{hi} are cut")
        for i in range(hi - lo):
            if crc32(buf[i].data) != m.record_crc(layer, lo + i):
                raise SystemExit(f"{EXPERTS_FILE}: layer {layer} expert {lo + i} fails its CRC")
        parts = [m.field(f"{proj}.{p}") for p in ("weight", "scales", "biases")]
        w, s, b = (
            buf[:, f.offset : f.offset + f.nbytes].view(VIEWS[f.dtype]).reshape(hi - lo, *f.shape)
            for f in parts
        )
        bits = projection_quant(m.quantization, proj)["bits"]
        return dequantize(w, floats(s, parts[1].dtype), floats(b, parts[2].dtype), bits)


class Plan:
    """The GGUF tensors in write order: name, numpy-order shape, type, a chunk producer."""

    def __init__(self, layout: Layout, quantize: bool = True) -> None:
        import gguf  # noqa: PLC0415

        self.gguf = gguf
        self.quantize = quantize
        self.layout = layout
        t = layout.text
        self.n_layers = int(t["num_hidden_layers"])
        self.names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN35MOE, self.n_layers)
        self.entries: list[tuple[str, tuple[int, ...], Any, Chunks]] = []
        nk, nv = int(t["linear_num_key_heads"]), int(t["linear_num_value_heads"])
        self.key_dim = nk * int(t["linear_key_head_dim"])
        self.v_head = int(t["linear_value_head_dim"])
        self.nk, self.per_k = nk, nv // nk

    def v_order(self, n: int, head: int) -> np.ndarray:
        """Value heads grouped by key head -> tiled (llama.cpp's broadcast order), as an index."""
        if self.per_k == 1:
            return np.arange(n)
        return np.arange(n).reshape(self.nk, self.per_k, head).transpose(1, 0, 2).reshape(n)

    def add(self, gguf_name: str, shape: tuple[int, ...], chunks: Chunks) -> None:
        q = self.gguf.GGMLQuantizationType
        if gguf_name.endswith(F32_SUFFIXES) or len(shape) < 2 or not self.quantize:
            kind = q.F32
        elif shape[-1] % 32 == 0:
            kind = q.Q4_0
        else:
            kind = q.F16  # as the converter falls back where a row is not whole Q4_0 blocks
        self.entries.append((gguf_name, shape, kind, chunks))

    def resident(self, hf: str, fix: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        """One resident tensor: whole when `fix` reorders it, else in slices of rows."""
        lay = self.layout
        base = hf.removesuffix(".weight")
        key = base if base + ".scales" in lay.tensors else hf  # a quantized linear, or floats
        shape = lay.shape(key)
        if base.endswith(".dt_bias"):
            name = f"{self.names.get_name(base.replace('.dt_bias', '.dt_proj'))}.bias"
        else:
            name = f"{self.names.get_name(base)}{'.weight' if hf.endswith('.weight') else ''}"
        if name.startswith("None"):
            raise SystemExit(f"no GGUF name for {hf}")
        if base.endswith("conv1d"):
            shape = shape[:2]  # MLX (channels, kernel, 1)
        if base.endswith(".mlp.shared_expert_gate"):
            shape = shape[1:]  # (1, d_model): llama.cpp's {n_embd}

        def chunks() -> Iterator[np.ndarray]:
            if fix is not None or len(shape) < 2 or shape[0] <= ROWS:
                a = lay.read(key)
                yield (fix(a) if fix else a).reshape(shape)
                return
            for lo in range(0, shape[0], ROWS):
                yield lay.read(key, (lo, min(lo + ROWS, shape[0])))

        self.add(name, tuple(shape), chunks)

    def linear_attention(self, p: str) -> None:
        kd, vh = self.key_dim, self.v_head

        def qkv(a: np.ndarray) -> np.ndarray:
            v = a[2 * kd :]
            return np.concatenate([a[: 2 * kd], v[self.v_order(len(v), vh)]])

        def rows(head: int) -> Callable[[np.ndarray], np.ndarray]:
            return lambda a: a[self.v_order(len(a), head)]

        self.resident(f"{p}.in_proj_qkv.weight", qkv)
        self.resident(f"{p}.in_proj_z.weight", rows(vh))
        self.resident(f"{p}.in_proj_b.weight", rows(1))
        self.resident(f"{p}.in_proj_a.weight", rows(1))
        self.resident(f"{p}.A_log", lambda a: -np.exp(a[self.v_order(len(a), 1)]))
        self.resident(f"{p}.dt_bias", rows(1))
        self.resident(f"{p}.conv1d.weight", lambda a: qkv(a[..., 0]))
        self.resident(f"{p}.norm.weight")
        self.resident(f"{p}.out_proj.weight", lambda a: a[:, self.v_order(a.shape[1], vh)])

    def experts(self, layer: int) -> None:
        m, lay = self.layout.manifest, self.layout
        for proj in ("gate_proj", "up_proj", "down_proj"):
            f = m.field(f"{proj}.scales")
            rows = f.shape[0]
            cols = f.shape[1] * projection_quant(m.quantization, proj)["group_size"]

            def chunks(proj: str = proj) -> Iterator[np.ndarray]:
                for lo in range(0, m.n_experts, EXPERTS):
                    yield lay.experts(layer, lo, min(lo + EXPERTS, m.n_experts), proj)

            name = self.names.get_name(f"model.layers.{layer}.mlp.experts.{proj}") or ""
            self.add(f"{name}.weight", (m.n_experts, rows, cols), chunks)

    def build(self) -> Plan:
        lay = self.layout
        self.resident("model.embed_tokens.weight")
        for i in range(self.n_layers):
            p = f"model.layers.{i}"
            self.resident(f"{p}.input_layernorm.weight")
            if f"{p}.linear_attn.A_log" in lay.tensors:
                self.linear_attention(f"{p}.linear_attn")
            else:
                for w in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
                    self.resident(f"{p}.self_attn.{w}.weight")
            self.resident(f"{p}.post_attention_layernorm.weight")
            self.resident(f"{p}.mlp.gate.weight")
            self.experts(i)
            for w in ("gate_proj", "up_proj", "down_proj"):
                self.resident(f"{p}.mlp.shared_expert.{w}.weight")
            self.resident(f"{p}.mlp.shared_expert_gate.weight")
        self.resident("model.norm.weight")
        self.resident("lm_head.weight")
        return self


def rope_sections(rope: dict[str, Any], rope_dims: int) -> list[int]:
    """The interleaved-MRoPE sections: the config's, or the converter's default [11, 11, 10]
    (32 rotary pairs) split the same way over a smaller shape's pairs, which llama.cpp needs
    to fit. Text positions are equal in every section, so the split does not change the rope."""
    if rope.get("mrope_section"):
        return (list(rope["mrope_section"]) + [0, 0, 0])[:4]
    base, rest = divmod(rope_dims // 2, 3)
    return [base + (rest > 0), base + (rest > 1), base, 0]


def metadata(w: Any, layout: Layout, n_layers: int) -> None:
    """The keys `convert_hf_to_gguf.py` writes for Qwen3.5-MoE (no MTP layers)."""
    import gguf  # noqa: PLC0415

    t = layout.text
    rope = dict(t.get("rope_parameters") or t.get("rope_scaling") or {})
    head_dim = int(t.get("head_dim") or t["hidden_size"] // t["num_attention_heads"])
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(layout.path.name)
    w.add_block_count(n_layers)
    w.add_context_length(int(t["max_position_embeddings"]))
    w.add_embedding_length(int(t["hidden_size"]))
    if "intermediate_size" in t:
        w.add_feed_forward_length(int(t["intermediate_size"]))
    w.add_head_count(int(t["num_attention_heads"]))
    w.add_head_count_kv(int(t["num_key_value_heads"]))
    rope_dims = int(head_dim * float(rope.get("partial_rotary_factor", 0.25)))
    w.add_rope_dimension_sections(rope_sections(rope, rope_dims))
    w.add_rope_freq_base(float(rope.get("rope_theta", t.get("rope_theta", 10000.0))))
    w.add_layer_norm_rms_eps(float(t["rms_norm_eps"]))
    w.add_expert_count(int(t["num_experts"]))
    w.add_expert_used_count(int(t["num_experts_per_tok"]))
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_expert_feed_forward_length(int(t["moe_intermediate_size"]))
    w.add_expert_shared_feed_forward_length(int(t["shared_expert_intermediate_size"]))
    w.add_ssm_conv_kernel(int(t["linear_conv_kernel_dim"]))
    w.add_ssm_state_size(int(t["linear_key_head_dim"]))
    w.add_ssm_group_count(int(t["linear_num_key_heads"]))
    w.add_ssm_time_step_rank(int(t["linear_num_value_heads"]))
    w.add_ssm_inner_size(int(t["linear_value_head_dim"]) * int(t["linear_num_value_heads"]))
    interval = int(t.get("full_attention_interval", 4))
    types = t.get("layer_types") or [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)
    ]
    w.add_array(f"{ARCH}.attention.recurrent_layers", [x == "linear_attention" for x in types])
    w.add_full_attention_interval(interval)
    w.add_rope_dimension_count(rope_dims)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def vocabulary(w: Any, layout: Layout) -> None:
    """The byte-level BPE vocabulary as the converter's gpt2 path writes it, padded to the
    embedding's rows; the pre-tokenizer is named by its regex (a synthetic vocabulary has no
    known hash)."""
    import gguf  # noqa: PLC0415

    tok = json.loads((layout.path / "tokenizer.json").read_text())
    n_vocab = int(layout.text["vocab_size"])
    ids = dict(tok["model"]["vocab"])
    special = {a["content"]: a for a in tok.get("added_tokens", [])}
    ids.update({c: a["id"] for c, a in special.items()})
    by_id = {i: s for s, i in ids.items()}
    tokens, types = [], []
    for i in range(n_vocab):
        s = by_id.get(i)
        if s is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        else:
            tokens.append(s)
            kind = gguf.TokenType.NORMAL
            if s in special:
                control = special[s].get("special") or s.startswith("<|")
                kind = gguf.TokenType.CONTROL if control else gguf.TokenType.USER_DEFINED
            types.append(kind)
    pre = json.dumps(tok.get("pre_tokenizer"))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35" if json.dumps(QWEN35_SPLIT)[1:-1] in pre else "default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    gguf.SpecialVocab(layout.path, load_merges=True, n_vocab=n_vocab).add_to_gguf(w, quiet=True)


def write(layout_path: Path, out: Path, quantize: bool = True) -> None:
    """Write `out`; with `quantize` False every tensor is F32 (the layout's weights exactly,
    which checks the names and transforms without Q4_0's rounding)."""
    import gguf  # noqa: PLC0415

    layout = Layout(layout_path)
    plan = Plan(layout, quantize)
    missing = set(range(plan.n_layers)) - set(layout.manifest.moe_layers)
    if missing:
        raise SystemExit(f"layers {sorted(missing)} have no streamed experts: not handled")
    plan.build()
    w = gguf.GGUFWriter(out, ARCH)
    metadata(w, layout, plan.n_layers)
    vocabulary(w, layout)
    for name, shape, kind, _ in plan.entries:
        size = int(np.prod(shape))
        nbytes = {
            gguf.GGMLQuantizationType.Q4_0: size // 32 * 18,
            gguf.GGMLQuantizationType.F16: size * 2,
        }.get(kind, size * 4)
        w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    total, done, start = sum(1 for _ in plan.entries), 0, time.monotonic()
    for i, (name, _, kind, chunks) in enumerate(plan.entries):
        w.write_padding(fout, fout.tell())
        nbytes = 0
        for a in chunks():
            data = (
                q4_0(a)
                if kind == gguf.GGMLQuantizationType.Q4_0
                else a.astype(np.float16 if kind == gguf.GGMLQuantizationType.F16 else np.float32)
            )
            data.tofile(fout)
            nbytes += data.nbytes
        w.write_padding(fout, nbytes)
        done += nbytes
        print(
            f"\r[{i + 1}/{total}] {name:<28} {kind.name:<5} {done / 2**30:6.2f} GiB "
            f"{time.monotonic() - start:6.0f} s",
            end="",
            file=sys.stderr,
            flush=True,
        )
    w.close()
    print(file=sys.stderr)


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--f32"]
    if len(args) != 2:
        raise SystemExit(__doc__)
    out, f32 = Path(args[1]), "--f32" in sys.argv
    write(Path(args[0]), out, quantize=not f32)
    kind = "F32" if f32 else "Q4_0"
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB, {kind})")  # noqa: T201


if __name__ == "__main__":
    main()
