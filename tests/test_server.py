"""`edge0 serve` driven by the official openai and anthropic SDKs and raw HTTP: text equals
Engine.generate, usage, stop strings, fair queueing, and a disconnect frees the engine."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_helpers import KEY, TIERS, LiveServer, demo_model

from edge0.model.generate import SamplingSettings
from edge0.runtime.engine.sync import SyncEngine
from edge0.server.app import ServerConfig

PROMPT = "def parse(s):"
HOT = {"temperature": 0.9, "top_p": 0.95, "seed": 7}
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_model(tmp_path_factory)


@pytest.fixture(scope="module")
def live(model: Path) -> Iterator[LiveServer]:
    server = LiveServer(
        ServerConfig(
            model=model,
            engine={"tiers": TIERS, "mode": "route"},
            model_id="edge0-demo",
            api_key=KEY,
        )
    )
    with server:
        yield server


@pytest.fixture(scope="module")
def ref_engine(model: Path) -> Iterator[SyncEngine]:
    with SyncEngine(model, tiers=TIERS, mode="route") as eng:
        yield eng


@pytest.fixture(scope="module")
def reference(ref_engine: SyncEngine) -> Any:
    """Engine.generate's text for a prompt, with the same sampling settings (and seed)."""
    cache: dict[Any, str] = {}

    def ref(
        prompt: str,
        n: int,
        chat: bool,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> str:
        key = (prompt, n, chat, temperature, top_p, seed)
        if key not in cache:
            settings = SamplingSettings(max_tokens=n, temp=temperature, top_p=top_p, seed=seed)
            pieces = ref_engine.generate(prompt, max_tokens=n, sampling=settings, chat=chat)
            cache[key] = "".join(p for p in pieces if isinstance(p, str))
        return cache[key]

    return ref


def oai(live: LiveServer) -> openai.OpenAI:
    return live.openai(timeout=60)


def metric(live: LiveServer, name: str, **labels: str) -> float:
    text = httpx.get(f"{live.url}/metrics", headers=AUTH).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


def wait_for(cond: Any, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, HOT], ids=["greedy", "seeded"])
def test_openai_completions_equal_engine_generate(
    live: LiveServer, reference: Any, sampling: dict[str, Any]
) -> None:
    client = oai(live)
    want = reference(PROMPT, 8, chat=False, **sampling)
    whole = client.completions.create(model="edge0-demo", prompt=PROMPT, max_tokens=8, **sampling)
    assert whole.choices[0].text == want and want
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage is not None and whole.usage.completion_tokens == 8
    prompt_ids = live.backend.engine.tokenizer.encode(PROMPT)
    assert whole.usage.prompt_tokens == len(prompt_ids)
    chunks = list(
        client.completions.create(
            model="edge0-demo", prompt=PROMPT, max_tokens=8, stream=True, **sampling
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == want
    assert len(chunks) > 2 and chunks[-1].choices[0].finish_reason == "length"


def test_openai_chat_stream_with_usage(live: LiveServer, reference: Any) -> None:
    client = oai(live)
    want = reference(PROMPT, 10, chat=True, **HOT)
    messages: Any = [{"role": "user", "content": PROMPT}]
    whole = client.chat.completions.create(
        model="edge0-demo", messages=messages, max_tokens=10, **HOT
    )
    assert whole.choices[0].message.content == want
    assert whole.choices[0].message.role == "assistant"
    chunks = list(
        client.chat.completions.create(
            model="edge0-demo",
            messages=messages,
            max_completion_tokens=10,
            stream=True,
            stream_options={"include_usage": True},
            **HOT,
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 10
    assert usage.total_tokens == usage.prompt_tokens + 10
    # a conversation (system + turns) is served too; without a chat template it is laid out plainly
    convo: Any = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": PROMPT},
    ]
    reply = client.chat.completions.create(model="edge0-demo", messages=convo, max_tokens=4)
    assert reply.usage is not None and reply.usage.prompt_tokens > whole.usage.prompt_tokens  # type: ignore[union-attr]


def test_anthropic_messages_and_stream_events(live: LiveServer, reference: Any) -> None:
    client = live.anthropic(timeout=60)
    want = reference(PROMPT, 10, chat=True, temperature=0.0)
    # this SDK has no `temperature` argument; the API field still exists (default 1.0)
    args: Any = {
        "model": "edge0-demo",
        "max_tokens": 10,
        "extra_body": {"temperature": 0.0},
        "messages": [{"role": "user", "content": PROMPT}],
    }
    msg = client.messages.create(**args)
    assert msg.content[0].type == "text" and msg.content[0].text == want
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 10
    with client.messages.stream(**args) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == want and final.stop_reason == "max_tokens" and final.usage.output_tokens == 10
    # the raw event sequence
    with httpx.stream(
        "POST",
        f"{live.url}/v1/messages",
        json={**args, **args.pop("extra_body"), "stream": True},
        headers={"x-api-key": KEY},
        timeout=60,
    ) as r:
        events = [line[7:] for line in r.iter_lines() if line.startswith("event: ")]
    deltas = events[3:-3]
    assert events[:3] == ["message_start", "content_block_start", "ping"]
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert deltas and set(deltas) == {"content_block_delta"}


def test_stop_strings_cut_the_text(live: LiveServer, reference: Any) -> None:
    full = reference(PROMPT, 16, chat=False)
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert stop.strip(), f"pick another stop string from {full!r}"
    want = full[: full.index(stop)]
    client = oai(live)
    whole = client.completions.create(
        model="edge0-demo", prompt=PROMPT, max_tokens=16, temperature=0, stop=[stop, "\x00never"]
    )
    assert whole.choices[0].text == want and whole.choices[0].finish_reason == "stop"
    chunks = client.completions.create(
        model="edge0-demo", prompt=PROMPT, max_tokens=16, temperature=0, stop=stop, stream=True
    )
    assert "".join(c.choices[0].text for c in chunks) == want
    claude = live.anthropic()
    chat_full = reference(PROMPT, 16, chat=True)  # the demo's chat template shapes the prompt
    stop = chat_full[len(chat_full) // 2 : len(chat_full) // 2 + 3]
    assert stop.strip(), f"pick another stop string from {chat_full!r}"
    msg = claude.messages.create(
        model="edge0-demo",
        max_tokens=16,
        stop_sequences=[stop],
        extra_body={"temperature": 0.0},
        messages=[{"role": "user", "content": PROMPT}],
    )
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == stop
    assert msg.content[0].text == reference(PROMPT, 16, chat=True).split(stop)[0]  # type: ignore[union-attr]


def test_concurrent_clients_are_served_in_full_in_arrival_order(
    live: LiveServer, reference: Any
) -> None:
    prompts = ["import os", "class Node:", "def main():", "# parse the"]
    done: list[int] = []

    async def one(client: openai.AsyncOpenAI, i: int) -> str:
        await asyncio.sleep(0.2 * i)  # arrivals 200 ms apart
        stream = await client.completions.create(
            model="edge0-demo", prompt=prompts[i], max_tokens=8, temperature=0, stream=True
        )
        text = "".join([c.choices[0].text async for c in stream])
        done.append(i)
        return text

    async def main() -> list[str]:
        client = openai.AsyncOpenAI(base_url=f"{live.url}/v1", api_key=KEY, max_retries=0)
        async with client:
            return await asyncio.gather(*(one(client, i) for i in range(len(prompts))))

    assert asyncio.run(main()) == [reference(p, 8, chat=False) for p in prompts]
    assert done == sorted(done)  # first come, first served
    assert metric(live, "edge0_requests_in_flight") == 0


def test_disconnect_mid_stream_frees_the_engine(live: LiveServer, reference: Any) -> None:
    cancelled = metric(live, "edge0_requests_total", api="openai.completions", outcome="cancelled")
    tokens = metric(live, "edge0_completion_tokens_total")
    body = {
        "model": "edge0-demo",
        "prompt": PROMPT,
        "max_tokens": 400,
        "temperature": 0,
        "stream": True,
    }
    with httpx.stream(
        "POST", f"{live.url}/v1/completions", json=body, headers=AUTH, timeout=60
    ) as r:
        assert r.status_code == 200
        first = next(line for line in r.iter_lines() if line.startswith("data: "))
        assert '"text"' in first
    # the connection is closed: the request ends at once, far short of its 400 tokens
    wait_for(
        lambda: (
            metric(live, "edge0_requests_total", api="openai.completions", outcome="cancelled")
            == cancelled + 1
        )
    )
    assert metric(live, "edge0_completion_tokens_total") - tokens < 400
    assert metric(live, "edge0_requests_in_flight") == 0
    # the next request is served, in full
    reply = oai(live).completions.create(
        model="edge0-demo", prompt=PROMPT, max_tokens=6, temperature=0
    )
    assert reply.choices[0].text == reference(PROMPT, 6, chat=False)


def test_disconnect_before_a_whole_answer_cancels_it(live: LiveServer) -> None:
    before = metric(live, "edge0_requests_total", api="anthropic.messages", outcome="cancelled")
    payload = (
        b'{"model": "m", "max_tokens": 400, "temperature": 0, '
        b'"messages": [{"role": "user", "content": "def parse(s):"}]}'
    )
    host, port = live.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"x-api-key: "
            + KEY.encode()
            + b"\r\nContent-Length: "
            + str(len(payload)).encode()
            + b"\r\n\r\n"
            + payload
        )
        time.sleep(0.3)  # the request is queued or generating
    wait_for(
        lambda: (
            metric(live, "edge0_requests_total", api="anthropic.messages", outcome="cancelled")
            == before + 1
        )
    )
    assert metric(live, "edge0_requests_in_flight") == 0


def test_models_health_and_metrics(live: LiveServer) -> None:
    models = oai(live).models.list()
    assert [m.id for m in models.data] == ["edge0-demo"]
    assert oai(live).models.retrieve("edge0-demo").id == "edge0-demo"
    health = httpx.get(f"{live.url}/health", headers=AUTH).json()
    assert health["status"] == "ok" and health["model"] == "edge0-demo"
    text = httpx.get(f"{live.url}/metrics", headers=AUTH).text
    for name in (
        "edge0_decode_tokens_per_second_last",
        "edge0_blocked_load_ms_per_step_last",
        "edge0_bytes_per_token_last",
        "edge0_cache_hit_rate_last",
        "edge0_slot_hit_rate_last",
        "edge0_tier_errors_total",
        "process_resident_memory_bytes",
    ):
        assert f"\n{name}" in text, name
