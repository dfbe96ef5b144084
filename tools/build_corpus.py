"""Build the teacher corpus (stdlib sources, split by file) and its byte-level BPE tokenizer."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # before tokenizers starts its pool

from tokenizers import (  # noqa: E402
    Tokenizer,
    decoders,
    models,
    pre_tokenizers,
    processors,
    trainers,
)

EOT = "<|endoftext|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = [EOT, PAD]
# Directory names whose files are left out: test suites, installed packages, demo/tool scripts.
SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
MAX_FILE_BYTES = 400_000  # a few generated tables are huge and teach nothing


def stdlib_root() -> Path:
    """The running interpreter's standard library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def iter_sources(root: Path) -> Iterator[tuple[str, str]]:
    """Yield (relative posix path, text) for every kept *.py file, sorted by path."""
    paths = sorted(p for p in root.rglob("*.py") if p.is_file())
    for path in paths:
        rel = path.relative_to(root)
        if any(part in SKIP_DIRS for part in rel.parts[:-1]):
            continue
        data = path.read_bytes()
        if not data.strip() or len(data) > MAX_FILE_BYTES:
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        yield rel.as_posix(), text.replace("\r\n", "\n")


def is_heldout(rel: str, heldout_percent: int) -> bool:
    """Held-out by file: a stable hash of the relative path picks ~heldout_percent% of files."""
    bucket = int.from_bytes(hashlib.sha256(rel.encode()).digest()[:4], "big") % 100
    return bucket < heldout_percent


def write_split(root: Path, out: Path, heldout_percent: int) -> dict[str, object]:
    """Write train.txt / heldout.txt (documents joined by EOT) and return a summary."""
    counts = {"train": [0, 0], "heldout": [0, 0]}  # split -> [files, chars]
    with (
        open(out / "train.txt", "w", encoding="utf-8") as ftrain,
        open(out / "heldout.txt", "w", encoding="utf-8") as fheld,
    ):
        for rel, text in iter_sources(root):
            split = "heldout" if is_heldout(rel, heldout_percent) else "train"
            fh = fheld if split == "heldout" else ftrain
            fh.write(text.rstrip("\n") + "\n" + EOT)
            counts[split][0] += 1
            counts[split][1] += len(text)
    return {
        "stdlib": str(root),
        "python": sys.version.split()[0],
        "heldout_percent": heldout_percent,
        "files": {k: v[0] for k, v in counts.items()},
        "chars": {k: v[1] for k, v in counts.items()},
    }


def train_tokenizer(train_txt: Path, vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE tokenizer on the training split (single-threaded: deterministic)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    docs = train_txt.read_text(encoding="utf-8").split(EOT)
    tok.train_from_iterator((d for d in docs if d), trainer=trainer, length=len(docs))
    return tok


def tokenizer_config(max_length: int) -> dict[str, object]:
    """tokenizer_config.json that transformers' PreTrainedTokenizerFast and mlx-lm both read."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOT,
        "pad_token": PAD,
        "bos_token": None,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--heldout-percent", type=int, default=5)
    parser.add_argument("--max-length", type=int, default=512)
    args = parser.parse_args()

    args.out.mkdir(parents=True, exist_ok=True)
    summary = write_split(stdlib_root(), args.out, args.heldout_percent)
    tok = train_tokenizer(args.out / "train.txt", args.vocab_size)
    tok.save(str(args.out / "tokenizer.json"))
    cfg = tokenizer_config(args.max_length)
    (args.out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    tokens: dict[str, int] = {}
    for split in ("train", "heldout"):
        text = (args.out / f"{split}.txt").read_text(encoding="utf-8")
        tokens[split] = len(tok.encode(text).ids)
    summary["tokens"] = tokens
    summary["vocab_size"] = tok.get_vocab_size()
    (args.out / "corpus.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
