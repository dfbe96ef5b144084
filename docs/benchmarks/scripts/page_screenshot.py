"""The README's picture of `edge0 serve`'s page: the demo model, one chat, its timeline.

Starts `edge0 serve` (the demo model, one request at a time, under a memory budget), opens
its page in the OS's headless Chromium (Playwright), asks one greedy question and, once the
engine's stats line is in, saves a screenshot of the page.

Run: python docs/benchmarks/scripts/page_screenshot.py --out docs/img/serve-page.png
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import threading
from pathlib import Path

from playwright.sync_api import sync_playwright

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--prompt", default="def fibonacci(n):")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--budget", default="1GiB", help="--memory-budget (the page shows its plan)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    edge0 = str(Path(sys.executable).with_name("edge0"))
    proc = subprocess.Popen(
        [edge0, "serve", "--port", "0", "--max-batch", "1", "--memory-budget", args.budget],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    url = ""
    for line in proc.stderr:
        if m := re.search(r"on (http://127\.0\.0\.1:\d+)/v1", line):
            url = m.group(1)
            break
    if not url:
        raise SystemExit(f"edge0 serve exited ({proc.wait()})")
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=args.chromium, args=FLAGS)
            page = browser.new_page(viewport={"width": 1280, "height": 760})
            page.goto(url + "/")
            page.wait_for_function(
                "() => document.getElementById('feed').textContent.endsWith('live')"
            )
            page.fill("#max-tokens", str(args.max_tokens))
            page.fill("#prompt", args.prompt)
            page.click("#send")
            page.wait_for_function(
                "() => document.getElementById('final').textContent.startsWith('engine:')",
                timeout=120_000,
            )
            args.out.parent.mkdir(parents=True, exist_ok=True)
            bottom = page.evaluate("() => document.querySelector('main').scrollHeight + 60")
            clip = {"x": 0, "y": 0, "width": 1280, "height": min(760, bottom)}
            page.screenshot(path=str(args.out), clip=clip)
            browser.close()
    finally:
        proc.terminate()
        proc.wait(30)
    print(f"{args.out}: {args.out.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
