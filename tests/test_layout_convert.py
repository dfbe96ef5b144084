"""edge0 convert: HF -> layout runs like mlx-lm's int4 model; MLX int4 repacks bit-exactly."""

from __future__ import annotations

import shutil
import zlib
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
import zstandard
from layout_helpers import GROUP, greedy, mlx_lm_int4, tiny_hf

import edge0.layout.convert as convert_mod
from edge0.errors import ConversionError
from edge0.layout.convert import ConvertOptions, convert
from edge0.layout.load import load_layout
from edge0.layout.manifest import EXPERTS_FILE, ZSTD_FILE, ZSTD_INDEX_FILE
from edge0.layout.records import field_views
from edge0.layout.sources import _weight_files

PROMPT = [5, 17, 42, 99, 3, 250]
OPTS = ConvertOptions(group_size=GROUP)


@pytest.fixture(scope="module", params=["qwen3_moe", "qwen3_5_moe"])
def family(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp(request.param)
    hf = tiny_hf(root, request.param, shards=2 if request.param == "qwen3_moe" else 1)
    return {
        "root": root,
        "hf": hf,
        "mlx": mlx_lm_int4(hf, root / "mlx-int4"),
        "e0": root / "e0",
        "manifest": convert(hf, root / "e0", OPTS),
    }


def test_hf_convert_matches_mlx_lm_int4_greedy(family) -> None:  # type: ignore[no-untyped-def]
    import mlx_lm

    ref, _ = mlx_lm.load(str(family["mlx"]))
    ours = load_layout(family["e0"], dtype=None)
    assert ours.source_format == "edge0"
    want = greedy(ref, PROMPT)
    assert greedy(ours.model, PROMPT) == want
    x = mx.array(PROMPT)[None]
    assert mx.array_equal(ref(x), ours.model(x))


def test_edge0_load_dispatches_and_matches_loader(family) -> None:  # type: ignore[no-untyped-def]
    import edge0.model.loader

    ours = edge0.model.loader.load(family["e0"])
    ref = edge0.model.loader.load(family["mlx"])
    assert ours.source_format == "edge0"
    assert greedy(ours.model, PROMPT) == greedy(ref.model, PROMPT)


def test_mlx_int4_repack_is_bit_exact(family, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    m = convert(family["mlx"], tmp_path / "repack")
    src: dict[str, mx.array] = {}
    for f in family["mlx"].glob("*.safetensors"):
        src.update(mx.load(str(f)))
    resident = mx.load(str(tmp_path / "repack" / "resident.safetensors"))
    blob = np.fromfile(tmp_path / "repack" / EXPERTS_FILE, np.uint8)
    n_expert_fields = 0
    for key, value in src.items():
        if ".switch_mlp." not in key:
            assert resident[key].dtype == value.dtype and mx.array_equal(resident[key], value), key
            continue
        mlp, field = key.split(".switch_mlp.")
        layer = int(mlp.split("layers.")[1].split(".")[0])
        for e in range(m.n_experts):
            off = m.record_offset(layer, e)
            got = field_views(m, blob[off : off + m.record_size])[field]
            want = value[e].view(mx.uint16) if value.dtype == mx.bfloat16 else value[e]
            assert np.array_equal(got, np.asarray(want)), (key, e)
            n_expert_fields += 1
    assert n_expert_fields == m.n_records * 9
    assert set(resident) == {k for k in src if ".switch_mlp." not in k}
    # the repack also equals the direct HF conversion, byte for byte
    assert (tmp_path / "repack" / EXPERTS_FILE).read_bytes() == (
        family["e0"] / EXPERTS_FILE
    ).read_bytes()


def test_repack_refuses_requantization(family, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConversionError, match="without requantizing"):
        convert(family["mlx"], tmp_path / "x", ConvertOptions(bits=8))


def test_zstd_frames_and_index(family, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    m = convert(family["hf"], tmp_path / "z", ConvertOptions(group_size=GROUP, compress="zstd"))
    assert m.compression is not None
    assert (m.compression["file"], m.compression["index"]) == (ZSTD_FILE, ZSTD_INDEX_FILE)
    index = np.fromfile(tmp_path / "z" / ZSTD_INDEX_FILE, dtype="<u8").reshape(-1, 2)
    assert index.shape == (m.n_records, 2)
    frames = (tmp_path / "z" / ZSTD_FILE).read_bytes()
    raw = (tmp_path / "z" / EXPERTS_FILE).read_bytes()
    for i, (off, length) in enumerate(index.tolist()):
        record = zstandard.ZstdDecompressor().decompress(frames[off : off + length])
        assert record == raw[i * m.record_size : (i + 1) * m.record_size]
        assert zlib.crc32(record) == m.crc32[i]
    assert int(index[-1].sum()) == len(frames)


def test_experts_none_leaves_empty_stacks(family) -> None:  # type: ignore[no-untyped-def]
    lm = load_layout(family["e0"], experts="none")
    m = family["manifest"]
    layers = lm.model.layers
    for layer in m.moe_layers:
        sw = layers[layer].mlp.switch_mlp
        assert sw.gate_proj.weight.shape == (0, *m.field("gate_proj.weight").shape)
        assert sw.down_proj.scales.nbytes == 0
    full = load_layout(family["e0"], experts="resident")
    assert mx.array_equal(
        layers[0].self_attn.q_proj.weight
        if hasattr(layers[0], "self_attn")
        else layers[0].linear_attn.in_proj_qkv.weight,
        full.model.layers[0].self_attn.q_proj.weight
        if hasattr(layers[0], "self_attn")
        else full.model.layers[0].linear_attn.in_proj_qkv.weight,
    )


def test_refuses_existing_destination_unless_forced(family, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "keep").write_text("x")
    with pytest.raises(ConversionError, match="--force"):
        convert(family["hf"], dst, OPTS)
    assert (dst / "keep").exists()
    forced = ConvertOptions(group_size=GROUP, force=True)
    with pytest.raises(ConversionError, match="not an Edge0 output"):  # not ours: never deleted
        convert(family["hf"], dst, forced)
    assert (dst / "keep").read_text() == "x"
    (dst / "keep").unlink()
    convert(family["hf"], dst, forced)  # an empty directory
    convert(family["hf"], dst, forced)  # an earlier Edge0 output
    assert (dst / "edge0.json").exists()


@pytest.mark.parametrize("exc", [RuntimeError("disk on fire"), KeyboardInterrupt()])
def test_interrupted_conversion_leaves_nothing(family, tmp_path: Path, monkeypatch, exc) -> None:  # type: ignore[no-untyped-def]
    real = convert_mod._expert_arrays
    calls = {"n": 0}

    def flaky(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 5:
            raise exc
        return real(*args, **kwargs)

    monkeypatch.setattr(convert_mod, "_expert_arrays", flaky)
    with pytest.raises(type(exc)):
        convert(family["hf"], tmp_path / "out", OPTS)
    assert calls["n"] == 5
    assert list(tmp_path.iterdir()) == []


def test_rejects_non_moe_and_bad_sources(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    with pytest.raises(ConversionError, match="config.json"):
        convert(src, tmp_path / "out")
    (src / "config.json").write_text('{"model_type": "qwen3_moe"}')
    mx.save_safetensors(str(src / "model.safetensors"), {"lm_head.weight": mx.zeros((4, 4))})
    with pytest.raises(ConversionError, match="dense model: it has no experts to stream"):
        convert(src, tmp_path / "out")
    (src / "config.json").write_text('{"model_type": "qwen3_moe", "num_experts": 8}')
    with pytest.raises(ConversionError, match="no routed-expert tensors"):
        convert(src, tmp_path / "out")


def test_fp32_source_with_fp16_config_matches_mlx_lm(tmp_path: Path) -> None:
    import json

    import mlx_lm

    hf = tiny_hf(tmp_path, "qwen3_moe")
    weights = mx.load(str(hf / "model.safetensors"))
    mx.save_safetensors(
        str(hf / "model.safetensors"), {k: v.astype(mx.float32) for k, v in weights.items()}
    )
    config = json.loads((hf / "config.json").read_text())
    config["torch_dtype"] = "float16"
    (hf / "config.json").write_text(json.dumps(config))
    m = convert(hf, tmp_path / "e0", OPTS)
    assert m.field("up_proj.scales").dtype == "float16"
    ref, _ = mlx_lm.load(str(mlx_lm_int4(hf, tmp_path / "mlx")))
    ours = load_layout(tmp_path / "e0", dtype=None)
    assert greedy(ours.model, PROMPT) == greedy(ref, PROMPT)


def test_trained_artifacts_travel_with_the_model(tmp_path: Path) -> None:
    src = tiny_hf(tmp_path, "qwen3_moe")
    (src / "prerouter.safetensors").write_bytes(b"heads")
    (src / "prerouter.json").write_text("{}")
    (src / "prerouter-layer.safetensors").write_bytes(b"layer heads")
    (src / "prerouter-layer.json").write_text('{"horizon": "layer"}')
    (src / "adapters").mkdir()
    (src / "adapters" / "adapter_config.json").write_text('{"rank": 4}')
    dst = tmp_path / "out"
    convert(src, dst, OPTS)
    assert (dst / "prerouter.safetensors").read_bytes() == b"heads"
    assert (dst / "prerouter.json").read_text() == "{}"
    assert (dst / "prerouter-layer.safetensors").read_bytes() == b"layer heads"
    assert (dst / "prerouter-layer.json").read_text() == '{"horizon": "layer"}'
    assert (dst / "adapters" / "adapter_config.json").read_text() == '{"rank": 4}'


def test_trained_heads_are_never_taken_for_weight_shards(tmp_path: Path) -> None:
    for name in (
        "consolidated.safetensors",
        "prerouter.safetensors",
        "prerouter-layer.safetensors",
        "adapters.safetensors",
    ):
        (tmp_path / name).write_bytes(b"")
    assert _weight_files(tmp_path) == [tmp_path / "consolidated.safetensors"]


def test_refuses_when_the_disk_is_too_small(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    src = tiny_hf(tmp_path, "qwen3_moe")
    tiny_disk = shutil.disk_usage(tmp_path)._replace(free=1024)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: tiny_disk)
    with pytest.raises(ConversionError, match=r"GB free; .* plus a margin of .*\(5% \+ 256 MiB"):
        convert(src, tmp_path / "out", OPTS)
    assert not (tmp_path / "out").exists()
