"""Reference logits from transformers (torch, fp32) for the test fixtures.

For each fixture in tests/fixtures/<model_type>/ this runs the architecture's
reference implementation (transformers' Qwen3MoeForCausalLM / Qwen3_5MoeForCausalLM)
in float32 on a fixed prompt, then 8 greedy decode steps through its cache, and writes
tests/fixtures/golden/<model_type>.npz with:
    prompt_ids (T,), prefill_logits (T, V), decode_ids (8,), decode_logits (8, V)
where decode_logits[i] are the logits after feeding decode_ids[i]. Needs torch
(the `train` extra). Usage:

    .venv/bin/python tools/golden_logits.py [--fixtures tests/fixtures]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n"
DECODE_STEPS = 8
MODEL_TYPES = ("qwen3_moe", "qwen3_5_moe")


def reference_model(path: Path) -> Any:
    """The transformers model for a fixture directory, float32, eval mode."""
    import torch
    import transformers

    model_type = json.loads((path / "config.json").read_text())["model_type"]
    # The Qwen3.5 MoE checkpoint is the multimodal layout; its text model is the reference.
    cls = {
        "qwen3_moe": transformers.Qwen3MoeForCausalLM,
        "qwen3_5_moe": transformers.Qwen3_5MoeForCausalLM,
        "llama4": transformers.Llama4ForConditionalGeneration,  # the hub's multimodal layout
    }.get(model_type, transformers.AutoModelForCausalLM)
    config = json.loads((path / "config.json").read_text())
    extra: dict[str, Any] = {}
    if model_type == "kimi_k2":  # its hub code is DeepSeek-V3's; transformers has no kimi_k2
        extra["config"] = transformers.DeepseekV3Config(**dict(config, model_type="deepseek_v3"))
    if (config.get("quantization_config") or {}).get("quant_method") == "mxfp4":
        # gpt-oss hub form: MXFP4 experts dequantized (exactly: e2m1 x 2^k fits bf16)
        extra["quantization_config"] = transformers.Mxfp4Config(dequantize=True)
    model, info = cls.from_pretrained(path, dtype=torch.float32, output_loading_info=True, **extra)
    # a tied head is not in the checkpoint (save_pretrained leaves it out); transformers ties it
    tied = (
        {"lm_head.weight"}
        if model.get_output_embeddings() is not None
        and (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
        else set()
    )
    bad = {k: v for k, v in info.items() if v and not (k == "missing_keys" and set(v) <= tied)}
    if bad:
        raise SystemExit(f"{path}: transformers did not load the checkpoint cleanly: {bad}")
    if model_type == "llama4":  # text-only: its language model (transformers 5.24's multimodal
        model = model.language_model  # forward fails building its output without an image)
    return model.eval()


def reference_logits(path: Path, prompt_ids: list[int]) -> dict[str, np.ndarray]:
    """Prefill logits and DECODE_STEPS greedy cached decode steps, as numpy float32."""
    import torch

    model = reference_model(path)
    with torch.no_grad():
        out = model(torch.tensor([prompt_ids]), use_cache=True)
        prefill = out.logits[0].float().numpy()
        cache = _cache(out)
        token = int(prefill[-1].argmax())
        ids, logits = [], []
        for _ in range(DECODE_STEPS):
            out = model(torch.tensor([[token]]), cache=cache, use_cache=True)
            cache = _cache(out)
            step = out.logits[0, -1].float().numpy()
            ids.append(token)
            logits.append(step)
            token = int(step.argmax())
    return {
        "prompt_ids": np.array(prompt_ids, dtype=np.int64),
        "prefill_logits": prefill.astype(np.float32),
        "decode_ids": np.array(ids, dtype=np.int64),
        "decode_logits": np.stack(logits).astype(np.float32),
    }


def _cache(out: Any) -> Any:
    # transformers >= 5.2x names the returned cache `cache` (formerly `past_key_values`).
    return out["cache"] if "cache" in out else out["past_key_values"]


def prompt_ids(path: Path) -> list[int]:
    from tokenizers import Tokenizer

    return list(Tokenizer.from_file(str(path / "tokenizer.json")).encode(PROMPT).ids)


@click.command()
@click.option("--fixtures", type=click.Path(path_type=Path), default=ROOT / "tests" / "fixtures")
def main(fixtures: Path) -> None:
    (fixtures / "golden").mkdir(exist_ok=True)
    for model_type in MODEL_TYPES:
        path = fixtures / model_type
        result = reference_logits(path, prompt_ids(path))
        target = fixtures / "golden" / f"{model_type}.npz"
        np.savez_compressed(target, **result)
        click.echo(
            f"{target}: {len(result['prompt_ids'])} prompt tokens, decode ids "
            f"{result['decode_ids'].tolist()}"
        )


if __name__ == "__main__":
    main()
