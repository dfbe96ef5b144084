"""The live page of `edge0 serve` in a real headless Chromium (the OS's, driven by Playwright):
it loads with no console errors, a chat streams an answer, the timeline draws that request's
steps, a wrong API key is refused, and the page reaches nothing but the server."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from server_helpers import demo_model
from test_server_cli import _start

CHROMIUM = os.environ.get("EDGE0_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
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
KEY = "page-key-42"


def _playwright() -> Any:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install '.[test]')")
    if not Path(CHROMIUM).exists():
        pytest.skip(
            f"no Chromium at {CHROMIUM}: install the OS's (apt-get install chromium), "
            "or name one in EDGE0_CHROMIUM"
        )
    return sync_playwright


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    model = demo_model(tmp_path_factory)
    env = {**os.environ, "EDGE0_API_KEY": KEY}
    # a sized RAM cache keeps the plan streaming (else the demo's layers all fit resident)
    args = ["--max-batch", "1", "--memory-budget", "1GiB", "--tiers", "ram:1MiB>pread"]
    proc, url = _start([str(model), *args], env)
    assert proc.stderr is not None
    drain = threading.Thread(target=proc.stderr.read, daemon=True)  # a full pipe would stall it
    drain.start()
    try:
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        drain.join(timeout=5)
        proc.stderr.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_playwright = _playwright()
    with sync_playwright() as pw:  # launch() gives Chromium a fresh profile directory of its own
        b = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield b
        finally:
            b.close()


class Page:
    """A page of the server in a fresh context whose network reaches the server alone."""

    def __init__(self, browser: Any, url: str, key: str | None) -> None:
        creds = {"username": "edge0", "password": key} if key is not None else None
        self.context = browser.new_context(http_credentials=creds)
        self.origin = url
        self.asked: list[str] = []  # every URL the page asked for
        self.blocked: list[str] = []  # ... of them not on the server (aborted)
        self.errors: list[str] = []  # console errors and uncaught exceptions
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def _route(self, route: Any) -> None:
        url = route.request.url
        self.asked.append(url)
        if urlsplit(url)[:2] != urlsplit(self.origin)[:2]:
            self.blocked.append(url)
            route.abort()
        else:
            route.continue_()

    def until(self, expr: str, timeout: float = 30_000) -> None:
        """Wait until the JavaScript `expr` holds (a function: the page's CSP forbids eval)."""
        self.page.wait_for_function(f"() => ({expr})", timeout=timeout)

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def page(browser: Any, server: str) -> Iterator[Page]:
    p = Page(browser, server, KEY)
    yield p
    p.close()


def test_the_page_loads_with_no_console_errors_and_reaches_only_the_server(
    page: Page, server: str
) -> None:
    response = page.page.goto(server + "/")
    assert response is not None and response.status == 200
    csp = response.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    page.until("document.getElementById('mode').textContent === 'exact'")
    page.until("document.getElementById('feed').textContent === 'events: live'")
    assert "hint" in page.page.text_content("#model")
    plan = page.page.text_content("#plan") or ""
    assert plan.startswith("memory budget 1024 MiB = resident") and "slots" in plan, plan
    rows = page.page.locator("#layers tbody tr")
    assert rows.count() == 8  # the demo's streamed layers
    # the page's own policy: script may reach the server alone
    outside = page.page.evaluate(
        """() => new Promise((done) => {
            let violated = false;
            document.addEventListener('securitypolicyviolation', () => { violated = true; });
            fetch('http://203.0.113.7/x').then(() => done('fetched'),
                () => setTimeout(() => done(violated ? 'refused by CSP' : 'failed'), 50));
        })"""
    )
    assert outside == "refused by CSP"
    assert page.blocked == []  # the browser never even asked for another origin
    assert all(u.startswith(server) for u in page.asked), page.asked
    errors = [e for e in page.errors if "203.0.113.7" not in e]  # the probe's own report
    assert errors == []


def test_a_chat_streams_an_answer_and_the_timeline_draws_its_steps(page: Page, server: str) -> None:
    page.page.goto(server + "/")
    page.until("document.getElementById('feed').textContent === 'events: live'")
    page.page.fill("#system", "You are terse.")
    page.page.fill("#temperature", "0")
    page.page.fill("#max-tokens", "48")
    page.page.evaluate(  # the answer's texts as it was drawn: a streamed answer grows
        """() => { window.seen = []; new MutationObserver(() => { const a =
            document.querySelector('.msg.assistant'); if (a) window.seen.push(a.textContent); })
            .observe(document.getElementById('log'), {subtree: true, childList: true,
                     characterData: true}); }"""
    )
    page.page.fill("#prompt", "def fibonacci(n):")
    page.page.click("#send")
    page.until(
        "document.getElementById('usage').textContent.includes('completion')", timeout=120_000
    )
    answer = page.page.text_content(".msg.assistant")
    # the same request through the API: greedy, so the same text
    body = {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "def fibonacci(n):"},
        ],
        "max_tokens": 48,
        "temperature": 0,
    }
    r = httpx.post(
        server + "/v1/chat/completions", json=body, headers={"x-api-key": KEY}, timeout=120
    )
    assert r.status_code == 200
    assert answer == r.json()["choices"][0]["message"]["content"] and answer
    seen = [t for t in page.page.evaluate("window.seen") if t]
    assert all(answer.startswith(t) for t in seen) and len(set(seen)) >= 2, seen
    usage = page.page.text_content("#usage")
    assert f"{r.json()['usage']['completion_tokens']} completion" in usage
    # the timeline: that request's steps, drawn
    page.until("document.getElementById('final').textContent.startsWith('engine: prompt')")
    steps = int(page.page.get_attribute("#timeline", "data-steps") or 0)
    assert steps >= 48  # a prompt step, then a step per token after the first
    stats = page.page.text_content("#stats")
    assert "47 decode steps" in stats and stats.endswith("| exact"), stats
    drawn = page.page.evaluate(
        """() => { const c = document.getElementById('timeline');
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            let blue = 0; for (let i = 0; i < d.length; i += 4)
              if (d[i] === 0x3b && d[i + 1] === 0x6f && d[i + 2] === 0xd8) blue += 1;
            return blue; }"""
    )
    assert drawn > 100  # compute bars in the canvas
    cells = page.page.locator("#layers tbody tr").nth(1).locator("td").all_text_contents()
    assert cells[2].endswith("%") and cells[4].endswith("%"), cells  # slot hits, recall
    assert page.errors == []


def test_a_wrong_api_key_is_refused(browser: Any, server: str, page: Page) -> None:
    p = Page(browser, server, "not-the-key")  # a wrong key: the 401 in the API's shape
    try:
        response = p.page.goto(server + "/")
        assert response is not None and response.status == 401
        assert "wrong API key" in (p.page.text_content("body") or "")
    finally:
        p.close()
    p = Page(browser, server, None)  # no key: the browser has no password to give, no page
    try:
        with pytest.raises(Exception, match="ERR_INVALID_AUTH_CREDENTIALS"):
            p.page.goto(server + "/")
    finally:
        p.close()
    page.page.goto(server + "/")  # the right key; then the page's own fetch with a wrong one
    answer = page.page.evaluate(
        """() => fetch('/v1/edge0/events', {headers: {authorization: 'Bearer nope'}})
            .then(async (r) => [r.status, (await r.json()).error.code])"""
    )
    assert answer == [401, "invalid_api_key"]
    r = httpx.get(server + "/v1/edge0/events", headers={"x-api-key": "nope"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    wrong = "Basic " + base64.b64encode(b"edge0:nope").decode()
    r = httpx.get(server + "/", headers={"authorization": wrong})
    assert r.status_code == 401 and "text/html" not in r.headers["content-type"]
