"""The pipeline's pure parts: the layer split, --hosts parsing, the message codec."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import attrs
import mlx.core as mx
import numpy as np
import pytest
from runtime_helpers import build_store

from edge0.errors import ConfigError
from edge0.layout.load import resident_bytes
from edge0.layout.manifest import Manifest
from edge0.model.generate import SamplingSettings
from edge0.options.engine import EngineOptions
from edge0.ranks.budget import layer_bytes
from edge0.ranks.hosts import parse_hosts
from edge0.ranks.link import STEP, Codec, Message, hidden_words, words_hidden
from edge0.ranks.pipeline import settings_words, words_settings
from edge0.ranks.plan import balance, parse_layers, plan_split
from edge0.runtime.plan.footprint import footprint


def brute_force(costs: list[int], size: int) -> int:
    best = None
    for cuts in itertools.combinations(range(1, len(costs)), size - 1):
        bounds = (0, *cuts, len(costs))
        worst = max(sum(costs[a:b]) for a, b in itertools.pairwise(bounds))
        best = worst if best is None else min(best, worst)
    assert best is not None
    return best


def test_balance_is_contiguous_and_minimises_the_largest_rank() -> None:
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(2, 9)
        size = rng.randint(2, n)
        costs = [rng.randint(1, 100) for _ in range(n)]
        split = balance(costs, size)
        assert [x for r in split.ranges for x in r] == list(range(n))
        assert all(len(r) >= 1 for r in split.ranges)
        assert max(split.cost) == brute_force(costs, size)


def test_balance_gives_a_heavy_first_layer_a_rank_of_its_own() -> None:
    assert balance([100, 10, 10, 10, 10], 2).text() == "1,4"
    # the others share the rest evenly (not 1,1,5: same largest rank, worse compute spread)
    assert balance([100, 10, 10, 10, 10, 10, 10], 3).text() == "1,3,3"
    with pytest.raises(ConfigError, match="at most 3 ranks"):
        balance([1, 1, 1], 4)


def test_parse_layers() -> None:
    assert parse_layers("3,5", 8, 2).ranges == (range(0, 3), range(3, 8))
    assert parse_layers("0-1,2-7", 8, 2).ranges == (range(0, 2), range(2, 8))
    for bad, size in (("4,5", 2), ("8", 2), ("0,8", 2), ("a,b", 2)):
        with pytest.raises(ConfigError, match="--layers"):
            parse_layers(bad, 8, size)


def test_layer_costs_count_every_resident_tensor_and_the_slot_tables(tmp_path: Path) -> None:
    path = build_store(tmp_path, "qwen3_5_moe")
    manifest = Manifest.load(path)
    opts = EngineOptions(mode="reactive", top_k=2, first_layer="wrap")  # nothing kept, no heads
    lb = layer_bytes(path, manifest, opts, 0)
    costs = lb.costs()
    loaded = resident_bytes(path, manifest, mx.float32)  # fp32 on the CPU backend
    fp = lb.fp
    assert sum(costs) == loaded + len(manifest.moe_layers) * 2 * fp.slot + fp.kv + fp.state
    first = manifest.moe_layers[0]
    kept = layer_bytes(path, manifest, attrs.evolve(opts, first_layer="resident"), 0).costs()
    assert kept[first] - costs[first] == fp_expert_bytes(path, manifest) - 2 * fp.slot
    assert plan_split(costs, 2, layers="1,3").text() == "1,3"


def fp_expert_bytes(path: Path, manifest: Manifest) -> int:
    opts = EngineOptions(mode="reactive", top_k=2)
    return footprint(path, manifest, opts, 0).resident_experts  # all experts of layer 0


def test_hosts_local_count_list_and_hostfile(tmp_path: Path) -> None:
    two = parse_hosts(2)
    assert [h.ip for h in two.hosts] == ["127.0.0.1", "127.0.0.1"]
    assert len(set(two.ports)) == 2  # free ports from the OS
    ring = json.loads(two.ring_json())
    assert ring == [[f"127.0.0.1:{p}"] for p in two.ports]
    listed = parse_hosts("10.0.0.1,10.0.0.2")
    assert listed.ports == (32323, 32324) and not listed.hosts[0].local
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(
        json.dumps(
            {"hosts": [{"ssh": "mac1", "ips": ["10.0.0.1"]}, {"ssh": "mac2", "ips": ["10.0.0.2"]}]}
        )
    )
    got = parse_hosts(str(hostfile), port=5000)
    assert [(h.ssh, h.ip) for h in got.hosts] == [("mac1", "10.0.0.1"), ("mac2", "10.0.0.2")]
    assert got.ports == (5000, 5001)
    with pytest.raises(ConfigError, match="at least 2 ranks"):
        parse_hosts("127.0.0.1")
    with pytest.raises(ConfigError, match="not an IP address"):
        parse_hosts("mac1,mac2")
    hostfile.write_text("{")
    with pytest.raises(ConfigError, match="cannot read the hosts file"):
        parse_hosts(str(hostfile))


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16, mx.float16])
def test_codec_round_trip_is_bit_exact(dtype: mx.Dtype) -> None:
    codec = Codec(k=4, d_model=64, itemsize=4)
    h = mx.random.normal((1, 1, 64)).astype(dtype)
    mx.eval(h)
    m = Message(
        STEP,
        request=3,
        step=17,
        pos=5,
        prefill=True,
        token=-1,
        pred=[7, 1, 0, 5],
        payload=hidden_words(h),
    )
    buf = codec.pack(m)
    assert buf.nbytes == codec.nbytes
    back = codec.unpack(buf)
    assert (back.kind, back.request, back.step, back.pos, back.prefill) == (STEP, 3, 17, 5, True)
    assert back.pred == [7, 1, 0, 5]
    assert back.payload is not None
    got = words_hidden(back.payload, 64, dtype)
    bits = mx.uint16 if dtype.size == 2 else mx.uint32
    assert np.array_equal(np.array(got.view(bits)), np.array(h.view(bits)))
    assert codec.unpack(codec.pack(Message(STEP))).pred is None  # no prediction != empty one


def test_sampling_settings_cross_the_ring() -> None:
    s = SamplingSettings(temp=0.7, top_p=0.9, top_k=20, min_p=0.05, seed=1234)
    got = words_settings(settings_words(s))
    assert (got.top_k, got.seed) == (20, 1234)
    assert got.temp == pytest.approx(0.7) and got.top_p == pytest.approx(0.9)
    assert words_settings(settings_words(SamplingSettings())).seed is None
