"""How long `edge0 run` takes to exit after SIGTERM while a long prompt is being processed.

    python docs/benchmarks/scripts/sigterm_prompt.py MODEL --prompt-len 2048 --after 30 \
        -- --mode route --top-k 4 --memory-budget 3GiB ...

Starts `edge0 run MODEL` on a prompt of about `--prompt-len` tokens (the bench's prompt text,
no chat template) with the given run flags, waits for its first expert read (its
`--log-json` events: the prompt's chunks have begun), waits `--after` seconds more, sends
SIGTERM and times the exit. Prints one JSON object (also to `--json`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click


def _prompt_text(model: Path, n: int) -> tuple[str, int]:
    """The bench's `n`-token prompt as text, and how many tokens that text encodes to."""
    from tokenizers import Tokenizer

    from edge0.bench.worker import encode_prompts

    tok = Tokenizer.from_file(str(model / "tokenizer.json"))

    class _Wrap:  # what encode_prompts uses of a tokenizer
        def encode(self, text: str) -> list[int]:
            return list(tok.encode(text).ids)

    text = str(tok.decode(encode_prompts(_Wrap(), 1, n)[0]))
    return text, len(tok.encode(text).ids)


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("model", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--prompt-len", default=2048, show_default=True)
@click.option("--after", default=30.0, show_default=True, help="Seconds after the first read.")
@click.option("--wait", default=900.0, show_default=True, help="Most seconds to the first read.")
@click.option("--json", "json_out", default=None, type=click.Path(dir_okay=False))
@click.argument("flags", nargs=-1, type=click.UNPROCESSED)
def main(
    model: Path,
    prompt_len: int,
    after: float,
    wait: float,
    json_out: str | None,
    flags: tuple[str, ...],
) -> None:
    text, tokens = _prompt_text(model, prompt_len)
    with tempfile.TemporaryDirectory() as tmp:
        events = Path(tmp) / "events.jsonl"
        cmd = [sys.executable, "-m", "edge0", "--log-json", str(events), "run", str(model)]
        cmd += ["-p", "-", "--no-chat", "--max-tokens", "4", "--stats", "full", *flags]
        t0 = time.monotonic()
        (Path(tmp) / "prompt.txt").write_text(text)
        outs = Path(tmp) / "stdout", Path(tmp) / "stderr"
        with (
            open(Path(tmp) / "prompt.txt") as fin,
            open(outs[0], "w") as o,
            open(outs[1], "w") as e,
        ):
            proc = subprocess.Popen(cmd, stdin=fin, stdout=o, stderr=e)
        first = None
        while first is None and time.monotonic() - t0 < wait and proc.poll() is None:
            time.sleep(0.5)
            if events.is_file() and '"event": "read"' in events.read_text(errors="replace"):
                first = time.monotonic() - t0
        if first is None:
            proc.kill()
            proc.wait()
            err = outs[1].read_text()[-2000:]
            sys.exit(f"no expert read within {wait} s (exit {proc.returncode}): {err}")
        time.sleep(after)
        running = proc.poll() is None
        sent = time.monotonic()
        load = os.getloadavg()
        proc.send_signal(signal.SIGTERM)
        proc.wait()
        gone = time.monotonic() - sent
        out, err = outs[0].read_text(), outs[1].read_text()
    result = {
        "prompt_len": prompt_len,
        "prompt_tokens": tokens,
        "flags": list(flags),
        "first_read_s": round(first, 2),
        "signal_at_s": round(sent - t0, 2),
        "running_at_signal": running,
        "exit_after_signal_s": round(gone, 3),
        "exit_code": proc.returncode,
        "text_before_exit": out,
        "stderr_tail": err.strip().splitlines()[-6:],
        "load_average_at_signal": load,
    }
    click.echo(json.dumps(result, indent=1))
    if json_out:
        Path(json_out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
