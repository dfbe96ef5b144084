"""Config values transformers computes and mlx-lm's classes lack, computed: each family's
variants (edge0/families/*: `variants`) in every streaming mode, their windows' caches,
the memory plan's windowed layers, and Kimi-K2's hub config.

Against transformers: tests/test_config_fidelity.py checks each variant's fp32 logits
(resident) within 1e-4 of its golden file and tests/test_config_probes.py every single
probe; here the converted int4 layout decodes the golden prompt (longer than the variants'
16 original positions of YaRN) to the same greedy tokens in every mode as resident.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache
from runtime_helpers import MockTier
from test_reference import edge0_logits

from edge0.layout.convert import ConvertOptions, convert
from edge0.model.loader import load
from edge0.runtime.engine.api import Engine
from edge0.runtime.plan.memory import KV_STEP, kv_bytes, working_bytes
from edge0.synth.fidelity_probes import VARIANTS
from edge0.synth.tiny_families import CONFIGS, fixture_file, write_family

FIXTURES = Path(__file__).parent / "fixtures"
STEPS = 8


def _golden(name: str) -> dict[str, np.ndarray]:
    return dict(np.load(FIXTURES / "golden" / f"{name}.npz"))


async def _decode(path: Path, prompt: list[int], **opts: Any) -> tuple[list[int], Any]:
    async with Engine.open(path, tiers=MockTier(path), **opts) as eng:
        return [t async for t in eng.tokens(prompt, max_tokens=STEPS, stop=False)], eng


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_decodes_alike_in_every_mode(tmp_path: Path, name: str) -> None:
    """reactive, hint (init heads) and route (oracle) greedy tokens equal resident's on the
    converted variant, over the prompt transformers' golden logits were made from."""
    hf = write_family(fixture_file(FIXTURES, name), tmp_path / "hf")
    e0 = tmp_path / "e0"
    convert(hf, e0, ConvertOptions(group_size=32))
    config = json.loads((hf / "config.json").read_text())
    context = (config.get("text_config") or config)["max_position_embeddings"]
    prompt = _golden(name)["prompt_ids"].tolist()[: context - STEPS]  # Edge0's context limit
    ref, _ = asyncio.run(_decode(e0, prompt, mode="resident"))
    got, eng = asyncio.run(
        _decode(e0, prompt, mode="reactive", record_routing=True, first_layer="wrap")
    )
    assert got == ref
    hint, _ = asyncio.run(_decode(e0, prompt, mode="hint", predictor="init", first_layer="wrap"))
    assert hint == ref
    oracle, _ = asyncio.run(
        _decode(
            e0,
            prompt,
            mode="route",
            predictor="oracle",
            first_layer="wrap",
            recording=eng.setup.ctx.recording,
        )
    )
    assert oracle == ref


def test_yarn_runs_past_its_original_context_and_matches_transformers(tmp_path: Path) -> None:
    """Qwen3-MoE with YaRN x4 over 16 original positions: a prompt (and decode) past them,
    within 1e-4 of transformers with the same greedy tokens."""
    golden = _golden("qwen3_moe-yarn")
    config = json.loads(fixture_file(FIXTURES, "qwen3_moe-yarn").read_text())["config"]
    rope = config["rope_parameters"]
    assert (rope["rope_type"], rope["factor"]) == ("yarn", 4.0)
    assert len(golden["prompt_ids"]) > rope["original_max_position_embeddings"]
    loaded = load(write_family(fixture_file(FIXTURES, "qwen3_moe-yarn"), tmp_path / "hf"))
    ours = edge0_logits(loaded, golden["prompt_ids"], golden["decode_ids"])
    for key in ("prefill_logits", "decode_logits"):
        assert float(np.abs(ours[key] - golden[key]).max()) <= 1e-4, key
    chain = [ours["prefill_logits"][-1].argmax(), *ours["decode_logits"][:-1].argmax(-1)]
    assert [int(t) for t in chain] == golden["decode_ids"].tolist()


@pytest.mark.parametrize(
    ("name", "windows"),
    [("mixtral-variant", [4, 4, 4]), ("qwen2_moe-variant", [4, None, 4])],
)
def test_a_sliding_window_bounds_that_layers_cache(
    tmp_path: Path, name: str, windows: list[int | None]
) -> None:
    """A windowed layer's cache keeps its window's tokens (mlx-lm's RotatingKVCache), a full
    layer's the whole context; the memory plan counts a window and one growth step."""
    loaded = load(write_family(fixture_file(FIXTURES, name), tmp_path / "hf"))
    caches = make_prompt_cache(loaded.model)
    got = [c.max_size if isinstance(c, RotatingKVCache) else None for c in caches]
    assert got == windows and all(isinstance(c, RotatingKVCache | KVCache) for c in caches)
    loaded.model(mx.array(np.arange(3, 40))[None], cache=caches)  # 37 prompt tokens
    mx.eval(loaded.model(mx.array([[5]]), cache=caches))  # and a decode step
    held = [c.keys.shape[2] if isinstance(c, RotatingKVCache) else None for c in caches]
    assert held == windows
    config = loaded.config
    text = config.get("text_config") or config
    per_token = 2 * int(text["num_key_value_heads"]) * int(text["head_dim"]) * 4
    context = 4 * KV_STEP
    want = sum(per_token * (context if w is None else w + KV_STEP) for w in windows)
    assert kv_bytes(config, context) == want
    assert working_bytes(config, context) - working_bytes(config, 1) == per_token * (
        (context if None in windows else windows[0] + KV_STEP) - KV_STEP
    )


def test_kimi_k2s_hub_config_loads_its_tokenizer_and_computes_its_rope(tmp_path: Path) -> None:
    """Kimi-K2 as the hub writes config.json (`rope_scaling` with `type`, model_type kimi_k2,
    which transformers has no class for): the tokenizer loads, the logits are the YaRN
    variant's (transformers' golden)."""
    hf = write_family(fixture_file(FIXTURES, "kimi_k2-yarn"), tmp_path / "hf")
    config = json.loads((hf / "config.json").read_text())
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = {"type": rope.pop("rope_type"), **rope}
    (hf / "config.json").write_text(json.dumps(config))
    golden = _golden("kimi_k2-yarn")
    ours = edge0_logits(load(hf), golden["prompt_ids"], golden["decode_ids"])
    for key in ("prefill_logits", "decode_logits"):
        assert float(np.abs(ours[key] - golden[key]).max()) <= 1e-4, key


@pytest.mark.parametrize("name", ["mixtral-variant", "qwen3_next-variant"])
def test_windowed_and_per_sequence_ropes_decode_batched_as_alone(tmp_path: Path, name: str) -> None:
    """Rows stacked into batch caches: a sliding window's rotating caches (mixtral) and a
    rope whose frequencies follow each row's own length (qwen3_next's dynamic) give each
    row the tokens it decodes alone."""
    from test_batch import together

    hf = write_family(fixture_file(FIXTURES, name), tmp_path / "hf")
    e0 = tmp_path / "e0"
    convert(hf, e0, ConvertOptions(group_size=32))
    prompts, ns, after = [[5, 17, 42, 8, 99, 3], [3, 9], [11, 12, 13, 14]], [6, 5, 3], [0, 0, 2]
    alone = [
        asyncio.run(_decode(e0, p, mode="reactive"))[0][:n]
        for p, n in zip(prompts, ns, strict=True)
    ]

    async def batched() -> tuple[list[list[int]], Any]:
        async with Engine.open(e0, tiers=MockTier(e0), mode="reactive", max_batch=3) as eng:
            return await together(eng, prompts, ns, after), eng.batcher

    got, batcher = asyncio.run(batched())
    assert got == alone
    assert batcher is not None and batcher._step.stacked and max(s.rows for s in batcher.log) == 3


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_the_plans_kv_bytes_are_what_the_caches_hold(tmp_path: Path, model_type: str) -> None:
    """Each family's `kv_token_bytes` (the memory plan's) against mlx-lm's caches after a
    prompt: a full layer's KVCache holds one growth step (DeepSeek-V3 its latent only)."""
    from edge0.runtime.plan.memory import layers_kv_bytes

    loaded = load(write_family(fixture_file(FIXTURES, model_type), tmp_path / "hf"))
    caches = make_prompt_cache(loaded.model)
    mx.eval(loaded.model(mx.array([[5, 17, 42, 8]]), cache=caches))
    planned = layers_kv_bytes(loaded.config, KV_STEP)
    full = [i for i, c in enumerate(caches) if type(c) is KVCache]
    assert full, model_type
    assert [caches[i].nbytes for i in full] == [planned[i] for i in full]


@pytest.mark.parametrize("name", ["qwen3_next-hybrid", "qwen3_5_moe-hybrid"])
def test_hybrid_layers_follow_layer_types_in_their_caches_and_the_plan(
    tmp_path: Path, name: str
) -> None:
    """An irregular `layer_types` (full attention first, where mlx-lm's every-n-th rule has
    none): each layer's cache is its kind's, the plan counts a KV cache for a full layer and
    the DeltaNet state for a linear one; each DeltaNet names its conv's activation."""
    from edge0.runtime.plan.memory import layer_state_bytes, layers_kv_bytes

    loaded = load(write_family(fixture_file(FIXTURES, name), tmp_path / "hf"))
    config = loaded.config
    text = config.get("text_config") or config
    linear = [kind == "linear_attention" for kind in text["layer_types"]]
    assert linear == [False, True, False, True]
    caches = make_prompt_cache(loaded.model)
    mx.eval(loaded.model(mx.array([[5, 17, 42, 8]]), cache=caches))
    assert [type(c) is not KVCache for c in caches] == linear
    planned = layers_kv_bytes(config, KV_STEP)
    state = layer_state_bytes(config)
    for c, lin, kv in zip(caches, linear, planned, strict=True):
        assert (kv, c.nbytes) == ((0, state) if lin else (c.nbytes, kv))
    deltanets = [
        layer.linear_attn for layer, lin in zip(loaded.model.layers, linear, strict=True) if lin
    ]
    acts = [gdn.conv_activation for gdn in deltanets]
    assert acts == [text["hidden_act"]] * 2


def test_llama4_layer_patterns_follow_their_caches_and_the_plan(tmp_path: Path) -> None:
    """Llama-4 with 3 layers, global attention on a RoPE layer and chunks on the last: the
    chunked layer's cache (mlx-lm's ChunkedKVCache) keeps its chunk past a long prompt, the
    global ones the context; the memory plan counts a chunk plus one growth step there."""
    from mlx_lm.models.cache import ChunkedKVCache

    from edge0.runtime.plan.memory import layers_kv_bytes

    loaded = load(write_family(fixture_file(FIXTURES, "llama4-layers"), tmp_path / "hf"))
    text = loaded.config["text_config"]
    assert text["layer_types"] == ["full_attention", "full_attention", "chunked_attention"]
    caches = make_prompt_cache(loaded.model)
    assert [type(c) for c in caches] == [KVCache, KVCache, ChunkedKVCache]
    prompt = 300  # past mlx-lm's growth step of 256
    loaded.model(mx.array(np.arange(prompt) % 250 + 3)[None], cache=caches)
    mx.eval(loaded.model(mx.array([[5]]), cache=caches))
    chunk = int(text["attention_chunk_size"])
    assert caches[2].offset - caches[2].start_position == chunk + 1  # trimmed, then the step
    planned = layers_kv_bytes(loaded.config, prompt + 1)
    per_token = 2 * int(text["num_key_value_heads"]) * int(text["head_dim"]) * 4
    assert planned == [per_token * 2 * KV_STEP] * 2 + [per_token * (chunk + KV_STEP)]
    assert [c.nbytes for c in caches[:2]] == planned[:2]
    assert caches[2].nbytes <= planned[2]
