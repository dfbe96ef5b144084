"""`edge0 train sft|distill` and `edge0 eval quality`: the recovery LoRA and its measurement."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from edge0.cli.options import renamed
from edge0.options.engine import ROUTE_POLICIES

SAMPLES_FILE = "samples.npz"


def _load_pair(model: str, teacher: str) -> tuple[Any, Any]:
    """(teacher at fp32, int4 student without adapters), after the OpenBLAS tip."""
    from edge0.cli.fp32 import blas_hint
    from edge0.train.fp32 import load_pair

    blas_hint()
    return load_pair(model, teacher)


def _heads(model: str, heads_dir: str | None, student: Any) -> tuple[Any, Any]:
    """(trained heads or None, init heads) for the student."""
    from edge0.routing.prerouter import PrerouterSet

    src = Path(heads_dir or model)
    trained = PrerouterSet.load(src) if PrerouterSet.exists(src) else None
    if trained is None:
        click.echo(f"no trained prerouter in {src}: using untrained (init) heads", err=True)
    return trained, PrerouterSet.from_model(student)


def _k(k: int | None, trained: Any, init: Any) -> int:
    if k is not None:
        return k
    if trained is not None and isinstance(trained.config.info.get("k"), int):
        return int(trained.config.info["k"])
    return max(1, init.config.top_k // 2)


def _windows(corpus: str, split: str, encode: Any, n: int, length: int) -> Any:
    from edge0.train.traces import corpus_windows

    return corpus_windows(corpus, split, encode, n, length)


_first_layer_option = click.option(
    "--first-layer",
    type=click.Choice(["wrap", "resident", "reactive"]),
    default=None,
    help="First MoE layer: routed by the wrap-around head, or its true top-K "
    "(resident/reactive) [default: edge0 run's default].",
)


def _wrap(first_layer: str | None) -> bool:
    from edge0.train.routed import runtime_wraps

    return runtime_wraps() if first_layer is None else first_layer == "wrap"


def _eos(tokenizer: Any) -> tuple[int, ...]:
    ids = getattr(tokenizer, "eos_token_ids", None) or []
    return tuple(sorted(int(i) for i in ids))


def _loop_options(fn: Any) -> Any:
    opts = [
        renamed(
            "--top-k",
            "--k",
            dest="k",
            type=int,
            default=None,
            help="Route capacity K [default: the heads' K, else top-k/2].",
        ),
        click.option(
            "--heads",
            "heads_dir",
            type=click.Path(exists=True, file_okay=False),
            default=None,
            help="Directory with prerouter.safetensors [default: MODEL].",
        ),
        _first_layer_option,
        click.option("--steps", default=300, show_default=True),
        click.option("--batch", default=4, show_default=True, help="Sequences per step."),
        click.option("--lr", default=2e-4, show_default=True),
        click.option("--eval-every", default=25, show_default=True),
        click.option("--max-minutes", type=float, default=None, help="Stop after this long."),
        click.option("--seed", default=0, show_default=True),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


@click.command("sft")
@click.argument("model", type=click.Path(exists=True, file_okay=False))
@click.argument("corpus", type=click.Path(exists=True))
@click.option("--teacher", required=True, type=click.Path(exists=True, file_okay=False))
@_loop_options
@click.option("--prompts", default=256, show_default=True, help="Training prompts.")
@click.option("--heldout", default=32, show_default=True, help="Held-out prompts.")
@click.option("--prompt-len", default=32, show_default=True)
@click.option("--gen-len", default=96, show_default=True, help="Teacher tokens per prompt.")
@renamed(
    "--temp",
    "--temperature",
    dest="temperature",
    default=1.0,
    show_default=True,
    help="Teacher sampling temperature.",
)
@click.option("--rank", default=8, show_default=True)
@click.option("--alpha", default=16.0, show_default=True, help="LoRA scale = alpha / rank.")
@click.option("--targets", default=None, help="Comma-separated layer-relative module paths.")
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Adapter directory [default: MODEL/adapters-sft].",
)
def sft(
    model: str,
    corpus: str,
    teacher: str,
    k: int | None,
    heads_dir: str | None,
    first_layer: str | None,
    steps: int,
    batch: int,
    lr: float,
    eval_every: int,
    max_minutes: float | None,
    seed: int,
    prompts: int,
    heldout: int,
    prompt_len: int,
    gen_len: int,
    temperature: float,
    rank: int,
    alpha: float,
    targets: str | None,
    out: str | None,
) -> None:
    """Stage 2: the int4 student in route mode learns TEACHER's samples of CORPUS prompts."""
    import mlx.core as mx
    import numpy as np

    from edge0.model import lora
    from edge0.train.sft import SftConfig, teacher_samples, train_sft

    t, s = _load_pair(model, teacher)
    trained, init = _heads(model, heads_dir, s.model)
    k = _k(k, trained, init)
    mx.random.seed(seed)
    enc = s.tokenizer.encode
    train_p = _windows(corpus, "train", enc, prompts, prompt_len)
    held_p = _windows(corpus, "heldout", enc, heldout, prompt_len)
    train = teacher_samples(t.model, train_p, gen_len, temperature, batch=16)
    held = teacher_samples(t.model, held_p, gen_len, temperature, batch=16)
    out_dir = Path(out or Path(model) / "adapters-sft")
    out_dir.mkdir(parents=True, exist_ok=True)
    np.savez(out_dir / SAMPLES_FILE, train=train, heldout=held, prompt_len=prompt_len)
    cfg_l = lora.LoraConfig(
        rank=rank, alpha=alpha, keys=tuple(targets.split(",")) if targets else None
    )
    lora.apply_lora(s.model, cfg_l)
    cfg = SftConfig(
        k=k,
        steps=steps,
        batch=batch,
        lr=lr,
        eval_every=eval_every,
        max_minutes=max_minutes,
        seed=seed,
        wrap=_wrap(first_layer),
        eos=_eos(s.tokenizer),
    )
    summary = train_sft(s.model, trained or init, train, held, prompt_len, cfg)
    meta = _meta("sft", k, trained, teacher, summary, cfg.wrap)
    lora.save_adapters(s.model, out_dir, cfg_l, meta=meta)
    click.echo(json.dumps({k_: v for k_, v in summary.items() if k_ != "history"}, indent=2))
    click.echo(
        f"held-out route-mode CE (K={k}): {summary['heldout_before']:.4f} -> "
        f"{summary['heldout_best']:.4f} nats/token; wrote {out_dir}"
    )


def _meta(
    stage: str, k: int, trained: Any, teacher: str, summary: dict[str, Any], wrap: bool | None
) -> dict[str, Any]:
    keep = ("steps", "heldout_before", "heldout_best", "seconds", "trainable_params")
    return {
        "stage": stage,
        "k": k,
        "heads": "trained" if trained is not None else "init",
        "first_layer": "wrap" if wrap else "true-top-k",
        "teacher": str(teacher),
        **{k_: summary[k_] for k_ in keep},
    }


@click.command("distill")
@click.argument("model", type=click.Path(exists=True, file_okay=False))
@click.argument("corpus", type=click.Path(exists=True))
@click.option("--teacher", required=True, type=click.Path(exists=True, file_okay=False))
@_loop_options
@click.option(
    "--init",
    "init_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Start from this adapter [default: MODEL/adapters-sft when present].",
)
@click.option(
    "--on-policy",
    default=1.0,
    show_default=True,
    help="Fraction of steps on student samples (the rest on teacher samples).",
)
@click.option("--beta", default=1.0, show_default=True, help="1 = reverse KL, 0 = forward KL.")
@click.option("--tail-k", default=8, show_default=True)
@click.option("--tail-weight", default=0.5, show_default=True)
@click.option("--gen-len", default=64, show_default=True, help="Student tokens per prompt.")
@renamed(
    "--temp",
    "--temperature",
    dest="temperature",
    default=1.0,
    show_default=True,
    help="Sampling temperature of the student's generations.",
)
@click.option("--prompt-len", default=32, show_default=True)
@click.option("--prompts", default=256, show_default=True)
@click.option("--rank", default=8, show_default=True, help="Only without --init.")
@click.option("--alpha", default=16.0, show_default=True, help="Only without --init.")
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Adapter directory [default: MODEL/adapters, what the runtime loads].",
)
def distill(
    model: str,
    corpus: str,
    teacher: str,
    k: int | None,
    heads_dir: str | None,
    first_layer: str | None,
    steps: int,
    batch: int,
    lr: float,
    eval_every: int,
    max_minutes: float | None,
    seed: int,
    init_dir: str | None,
    on_policy: float,
    beta: float,
    tail_k: int,
    tail_weight: float,
    gen_len: int,
    temperature: float,
    prompt_len: int,
    prompts: int,
    rank: int,
    alpha: float,
    out: str | None,
) -> None:
    """Stage 3: on-policy distillation of the routed int4 student towards TEACHER."""
    import mlx.core as mx
    import numpy as np

    from edge0.model import lora
    from edge0.train.distill import DistillConfig, train_distill
    from edge0.train.sft import SftConfig, teacher_samples

    t, s = _load_pair(model, teacher)
    trained, init = _heads(model, heads_dir, s.model)
    k = _k(k, trained, init)
    mx.random.seed(seed)
    src = Path(init_dir) if init_dir else Path(model) / "adapters-sft"
    if (src / lora.CONFIG_FILE).exists():
        cfg_l = lora.load_adapters(s.model, src)
        click.echo(f"starting from the adapter in {src}", err=True)
    else:
        cfg_l = lora.LoraConfig(rank=rank, alpha=alpha)
        lora.apply_lora(s.model, cfg_l)
    enc = s.tokenizer.encode
    if (src / SAMPLES_FILE).exists():
        data = np.load(src / SAMPLES_FILE)
        off, held, prompt_len = data["train"], data["heldout"], int(data["prompt_len"])
    else:
        held_p = _windows(corpus, "heldout", enc, 32, prompt_len)
        off = np.zeros((0, prompt_len + gen_len), np.int32)
        held = teacher_samples(t.model, held_p, gen_len, temperature, batch=16)
    if len(off) == 0 and on_policy < 1.0:
        raise click.UsageError("--on-policy < 1 needs teacher samples: run `edge0 train sft` first")
    train_p = _windows(corpus, "train", enc, prompts, prompt_len)
    loop = SftConfig(
        k=k,
        steps=steps,
        batch=batch,
        lr=lr,
        eval_every=eval_every,
        max_minutes=max_minutes,
        seed=seed,
        wrap=_wrap(first_layer),
        eos=_eos(s.tokenizer),
    )
    cfg = DistillConfig(
        loop=loop,
        on_policy=on_policy,
        beta=beta,
        tail_k=tail_k,
        tail_weight=tail_weight,
        temperature=temperature,
        gen_len=gen_len,
    )
    summary = train_distill(s.model, trained or init, t.model, train_p, off, held, cfg)
    out_dir = Path(out or Path(model) / lora.ADAPTER_DIR)
    meta = _meta("distill", k, trained, teacher, summary, loop.wrap)
    meta["on_policy_steps"] = summary["on_policy_steps"]
    lora.save_adapters(s.model, out_dir, cfg_l, meta=meta)
    click.echo(json.dumps({k_: v for k_, v in summary.items() if k_ != "history"}, indent=2))
    click.echo(
        f"held-out reverse KL (K={k}): {summary['heldout_before']:.4f} -> "
        f"{summary['heldout_best']:.4f}; wrote {out_dir}"
    )


@click.command("quality")
@click.argument("model", type=click.Path(exists=True, file_okay=False))
@click.argument("corpus", type=click.Path(exists=True))
@click.option("--teacher", required=True, type=click.Path(exists=True, file_okay=False))
@renamed(
    "--top-k",
    "--k",
    dest="k",
    type=int,
    default=None,
    help="Route capacity K [default: the heads' K, else top-k/2].",
)
@click.option(
    "--heads",
    "heads_dir",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Directory with prerouter.safetensors [default: MODEL].",
)
@_first_layer_option
@click.option(
    "--sft-adapter",
    type=click.Path(file_okay=False),
    default=None,
    help="Stage-2 adapter [default: MODEL/adapters-sft].",
)
@click.option(
    "--adapter",
    type=click.Path(file_okay=False),
    default=None,
    help="Final adapter, also merged [default: MODEL/adapters].",
)
@click.option("--tokens", default=8192, show_default=True, help="Held-out tokens scored.")
@click.option("--seq-len", default=128, show_default=True)
@click.option("--prompts", default=16, show_default=True, help="Prompts for greedy divergence.")
@click.option("--prompt-len", default=32, show_default=True)
@click.option("--gen-len", default=32, show_default=True)
@click.option("--split", default="heldout", show_default=True)
@click.option("--batch", default=8, show_default=True)
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None)
@renamed(
    "--md",
    "--markdown",
    dest="md_out",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write a markdown table here.",
)
@click.option(
    "--route-policy",
    "policies",
    multiple=True,
    type=click.Choice(ROUTE_POLICIES),
    help="Instead of the adapter variants: these route policies (repeatable) at K = "
    "--top-k, else top-k and top-k/2, through the streaming engine on MODEL (an "
    "edge0-layout dir), decode steps teacher-forced (edge0/eval/policy.py).",
)
@click.option(
    "--route-deadline-ms",
    "deadline_ms",
    type=click.FloatRange(0.0),
    default=None,
    help="With --route-policy: the deadline of available-first/deadline.",
)
@click.option(
    "--tiers",
    default="ram:1GiB>pread",
    show_default=True,
    help="With --route-policy: the engine's tier stack.",
)
def quality(
    model: str,
    corpus: str,
    teacher: str,
    k: int | None,
    heads_dir: str | None,
    first_layer: str | None,
    sft_adapter: str | None,
    adapter: str | None,
    tokens: int,
    seq_len: int,
    prompts: int,
    prompt_len: int,
    gen_len: int,
    split: str,
    batch: int,
    json_out: str | None,
    md_out: str | None,
    policies: tuple[str, ...],
    deadline_ms: float | None,
    tiers: str,
) -> None:
    """Perplexity ratio, KL, top-1 agreement, greedy divergence of each student variant
    (with --route-policy: of each route policy, with recall and decode speed)."""
    if policies:
        from edge0.cli.eval_policy import policy_quality

        policy_quality(
            model,
            corpus,
            teacher,
            policies,
            k,
            deadline_ms,
            tiers,
            tokens,
            seq_len,
            prompt_len,
            split,
            json_out,
            md_out,
        )
        return
    from edge0.eval.quality import Variant, evaluate_quality, markdown
    from edge0.model import lora

    t, s = _load_pair(model, teacher)
    trained, init = _heads(model, heads_dir, s.model)
    k = _k(k, trained, init)
    heads = {"init": init, **({"trained": trained} if trained is not None else {})}
    lora_heads = "trained" if trained is not None else "init"
    variants = [Variant("int4-resident", "resident"), Variant("route-init", "init")]
    if trained is not None:
        variants.append(Variant("route-trained", "trained"))
    sft_dir = Path(sft_adapter or Path(model) / "adapters-sft")
    final = Path(adapter or Path(model) / lora.ADAPTER_DIR)
    if (sft_dir / lora.CONFIG_FILE).exists():
        variants.append(Variant("lora-sft", lora_heads, sft_dir))
    if (final / lora.CONFIG_FILE).exists():
        stage = lora.read_config(final)[1].get("edge0", {}).get("stage", "distill")
        variants.append(
            Variant(f"lora-{stage}" if stage != "sft" else "lora-final", lora_heads, final)
        )
        variants.append(Variant("lora-merged", lora_heads, final, merged=True))
    enc = s.tokenizer.encode
    windows = _windows(corpus, split, enc, tokens // seq_len, seq_len + 1)
    greedy_p = _windows(corpus, split, enc, prompts, prompt_len) if prompts else windows[:0, :1]
    result = evaluate_quality(
        t.model,
        s.model,
        variants,
        heads,
        k,
        windows,
        greedy_p,
        gen_len,
        batch=batch,
        wrap=_wrap(first_layer),
    )
    result.update(
        model=str(model),
        teacher=str(teacher),
        corpus=str(corpus),
        split=split,
        tokens=int(windows.shape[0] * seq_len),
        seq_len=seq_len,
        prompts=prompts,
        prompt_len=prompt_len,
        gen_len=gen_len,
    )
    md = markdown(result)
    click.echo(md)
    if json_out:
        Path(json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(json_out).write_text(json.dumps(result, indent=2) + "\n")
    if md_out:
        Path(md_out).parent.mkdir(parents=True, exist_ok=True)
        Path(md_out).write_text(md)
