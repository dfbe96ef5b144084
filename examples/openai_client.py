r"""The official `openai` client talking to `edge0 serve`: list models, stream a chat reply, then
one plain completion with its token usage.

With no argument it starts `edge0 serve` on the demo model itself (a subprocess on a
free loopback port, stopped at the end); with a URL it talks to that server instead
(the key, if the server wants one, comes from EDGE0_API_KEY). It prints:

    server: http://127.0.0.1:PORT/v1 (started here | given)
    models: edge0-demo
    chat (streamed): <the reply as it arrives>
    completion: <text> | usage: prompt N, completion M, total N+M tokens

Run: python examples/openai_client.py [http://127.0.0.1:8080]   (needs `openai`: the `test` extra)

ci-run:
ci-run: http://127.0.0.1:{port}
ci-serve: edge0 serve {model} --port {port}
ci-expect: ^server: http://127\.0\.0\.1:\d+/v1 \((started here|given)\)$
ci-expect: ^models: \S+
ci-expect: ^chat \(streamed\):\s
ci-expect: ^completion: .* \| usage: prompt \d+, completion \d+, total \d+ tokens$
ci-bad-args: --no-such-option
ci-bad-args: not-a-url
ci-bad-args: http://127.0.0.1:9
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from _model import need

openai: Any = need("openai", "test")  # one line naming the extra when it is missing


@contextmanager
def edge0_server() -> Iterator[str]:
    """`edge0 serve` on a free port; yields its base URL, stops it afterwards."""
    cmd = [sys.executable, "-c", "from edge0.cli.main import main; main()", "serve", "--port", "0"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the server says where it listens once the model is loaded
            if match := re.search(r"on (http://\S+/v1)", line):
                yield match.group(1)
                break
        else:
            raise SystemExit(f"edge0 serve exited with code {proc.wait()}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def talk(base_url: str, how: str) -> None:
    print(f"server: {base_url} ({how})")
    client = openai.OpenAI(base_url=base_url, api_key=os.environ.get("EDGE0_API_KEY", "none"))
    models = [m.id for m in client.models.list()]
    print("models:", ", ".join(models))
    print("chat (streamed): ", end="", flush=True)
    stream = client.chat.completions.create(
        model=models[0],
        messages=[{"role": "user", "content": "def parse_args(argv):"}],
        max_tokens=32,
        temperature=0.7,
        seed=0,
        stream=True,
    )
    for chunk in stream:
        print(chunk.choices[0].delta.content or "", end="", flush=True)
    print()
    reply = client.completions.create(
        model=models[0], prompt="import os\n", max_tokens=16, temperature=0
    )
    u = reply.usage
    assert u is not None
    print(
        f"completion: {reply.choices[0].text!r} | usage: prompt {u.prompt_tokens}, "
        f"completion {u.completion_tokens}, total {u.total_tokens} tokens"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("url", nargs="?", help="a running edge0 serve (default: start one here)")
    url = p.parse_args().url
    if url is None:
        with edge0_server() as started:
            talk(started, "started here")
        return
    if not re.match(r"https?://[^/]+", url):
        p.error(f"URL {url!r} is not an http:// or https:// address")
    url = url.rstrip("/")
    try:
        talk(url if url.endswith("/v1") else url + "/v1", "given")
    except openai.APIConnectionError as exc:
        p.error(f"cannot reach {url}: {exc}")


if __name__ == "__main__":
    main()
