"""`edge0 train sft|distill` and `edge0 eval quality` end to end on the tiny fixture."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner

import edge0.model.loader
from edge0.cli import eval as eval_cmd
from edge0.cli import train as train_cmd
from edge0.model import lora
from edge0.synth.tiny import TOKENIZER_TEXT


def test_sft_distill_quality_cli(model_copy, qwen3_moe_path: Path, tmp_path: Path) -> None:
    model = model_copy("qwen3_moe")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.txt").write_text(TOKENIZER_TEXT * 12)
    (corpus / "heldout.txt").write_text(TOKENIZER_TEXT[::-1] * 6)
    runner = CliRunner()
    common = ["--teacher", str(qwen3_moe_path), "--k", "1", "--batch", "2", "--eval-every", "1"]
    r = runner.invoke(
        train_cmd.command,
        [
            "sft",
            str(model),
            str(corpus),
            *common,
            "--steps",
            "2",
            "--prompts",
            "4",
            "--heldout",
            "2",
            "--prompt-len",
            "8",
            "--gen-len",
            "6",
            "--rank",
            "2",
            "--lr",
            "1e-2",
        ],
    )
    assert r.exit_code == 0, r.output
    sft_dir = model / "adapters-sft"
    doc = json.loads((sft_dir / lora.CONFIG_FILE).read_text())
    assert doc["edge0"]["stage"] == "sft" and doc["edge0"]["k"] == 1
    assert doc["edge0"]["heads"] == "init" and doc["lora_parameters"]["rank"] == 2
    samples = np.load(sft_dir / "samples.npz")
    assert samples["train"].shape == (4, 14) and int(samples["prompt_len"]) == 8

    r = runner.invoke(
        train_cmd.command,
        [
            "distill",
            str(model),
            str(corpus),
            *common,
            "--steps",
            "2",
            "--prompts",
            "4",
            "--gen-len",
            "5",
            "--on-policy",
            "0.5",
            "--lr",
            "1e-2",
        ],
    )
    assert r.exit_code == 0, r.output
    doc = json.loads((model / lora.ADAPTER_DIR / lora.CONFIG_FILE).read_text())
    assert doc["edge0"]["stage"] == "distill" and doc["lora_parameters"]["rank"] == 2

    out = tmp_path / "quality.json"
    r = runner.invoke(
        eval_cmd.command,
        [
            "quality",
            str(model),
            "--teacher",
            str(qwen3_moe_path),
            str(corpus),
            "--k",
            "1",
            "--tokens",
            "48",
            "--seq-len",
            "16",
            "--prompts",
            "2",
            "--prompt-len",
            "8",
            "--gen-len",
            "4",
            "--json",
            str(out),
            "--markdown",
            str(tmp_path / "q.md"),
        ],
    )
    assert r.exit_code == 0, r.output
    result = json.loads(out.read_text())
    names = [row["variant"] for row in result["rows"]]
    assert names == ["int4-resident", "route-init", "lora-sft", "lora-distill", "lora-merged"]
    assert all(row["tokens"] == 48 for row in result["rows"])
    assert result["derived"]["kl_gap_closed"] is not None
    assert "| lora-merged | init |" in (tmp_path / "q.md").read_text()

    # The runtime hook picks MODEL/adapters up (and --no-adapter's enabled=False does not).
    loaded = edge0.model.loader.load(model)
    assert lora.maybe_apply_adapters(loaded.model, model, enabled=False) is False
    assert lora.maybe_apply_adapters(loaded.model, model) is True
    assert lora.lora_paths(loaded.model)
