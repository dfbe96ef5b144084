"""The server as an agent uses it, through the official SDKs on the demo model: tool calls
(both APIs, plain and streamed), schema-constrained JSON, logprobs, n choices."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import jsonschema
import mlx.core as mx
import numpy as np
import openai
import pytest
from server_helpers import KEY, TIERS, LiveServer, demo_model

from edge0.model.loader import load
from edge0.server.app import ServerConfig

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
OAI_TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather now", "parameters": WEATHER},
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Local time",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        },
    },
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": False,
}
BATCH = 5


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_model(tmp_path_factory)


@pytest.fixture(scope="module")
def live(model: Path) -> Iterator[LiveServer]:
    # hint mode: the answer is the resident model's, so logprobs can be checked against it
    config = ServerConfig(
        model=model,
        model_id="edge0-demo",
        api_key=KEY,
        engine={"tiers": TIERS, "mode": "hint", "max_batch": BATCH},
    )
    server = LiveServer(config)
    with server:
        yield server


def oai(live: LiveServer) -> openai.OpenAI:
    return live.openai(timeout=120)


def claude(live: LiveServer) -> anthropic.Anthropic:
    return live.anthropic(timeout=120)


def _streamed_call(chunks: Any) -> tuple[str, dict[str, Any], str]:
    """(name, arguments, finish_reason) of the one tool call in an OpenAI chunk stream."""
    name, args, finish = "", "", ""
    for c in chunks:
        for ch in c.choices:
            for tc in ch.delta.tool_calls or []:
                name += tc.function.name or ""
                args += tc.function.arguments or ""
            finish = ch.finish_reason or finish
    return name, json.loads(args), finish


def test_openai_tool_round_trip_plain_and_streamed(live: LiveServer) -> None:
    client = oai(live)
    args: dict[str, Any] = dict(
        model="edge0-demo",
        messages=ASK,
        tools=OAI_TOOLS,
        tool_choice="required",
        max_tokens=60,
        seed=1,
    )
    first = client.chat.completions.create(**args)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name in ("get_weather", "get_time")
    arguments = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        jsonschema.validate(arguments, WEATHER)
    # the same call streamed: tool_calls deltas that add up to the same call
    name, streamed, finish = _streamed_call(client.chat.completions.create(**args, stream=True))
    assert (name, streamed, finish) == (call.function.name, arguments, "tool_calls")
    # the tool's result goes back; the model answers in text (tool_choice none)
    history = [
        *ASK,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"},
    ]
    final = client.chat.completions.create(
        model="edge0-demo",
        messages=history,
        tools=OAI_TOOLS,
        tool_choice="none",
        max_tokens=8,
        seed=2,
    )
    assert final.choices[0].finish_reason in ("stop", "length")
    assert isinstance(final.choices[0].message.content, str)
    assert not final.choices[0].message.tool_calls
    pieces = client.chat.completions.create(
        model="edge0-demo",
        messages=history,
        max_tokens=8,
        tools=OAI_TOOLS,
        tool_choice="none",
        seed=2,
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in pieces if c.choices)
    assert text == final.choices[0].message.content


def test_openai_named_tool_choice_forces_that_tool(live: LiveServer) -> None:
    client = oai(live)
    for name in ("get_time", "get_weather"):
        out = client.chat.completions.create(
            model="edge0-demo",
            messages=ASK,
            tools=OAI_TOOLS,
            max_tokens=60,
            seed=3,
            tool_choice={"type": "function", "function": {"name": name}},
        )
        (call,) = out.choices[0].message.tool_calls or []
        assert call.function.name == name


# pydantic v2's schema of `class Order(BaseModel): item: Item; qty: int` with extra="forbid"
# (nested models go to `$defs`, referred to as `#/$defs/...`)
ORDER = {
    "$defs": {
        "Item": {
            "additionalProperties": False,
            "properties": {"sku": {"maxLength": 8, "title": "Sku", "type": "string"}},
            "required": ["sku"],
            "title": "Item",
            "type": "object",
        }
    },
    "properties": {
        "item": {"$ref": "#/$defs/Item"},
        "qty": {"maximum": 99, "minimum": 1, "title": "Qty", "type": "integer"},
    },
    "required": ["item", "qty"],
    "additionalProperties": False,
    "title": "Order",
    "type": "object",
}


def test_forced_calls_take_pydantic_schemas_with_defs(live: LiveServer) -> None:
    out = oai(live).chat.completions.create(
        model="edge0-demo",
        messages=ASK,
        tools=[{"type": "function", "function": {"name": "order", "parameters": ORDER}}],
        tool_choice="required",
        max_tokens=80,
        seed=4,
    )
    (call,) = out.choices[0].message.tool_calls or []
    jsonschema.validate(json.loads(call.function.arguments), ORDER)
    for choice in ({"type": "any"}, {"type": "tool", "name": "order"}):
        msg = claude(live).messages.create(
            model="edge0-demo",
            max_tokens=80,
            messages=ASK,  # type: ignore[arg-type]
            tools=[{"name": "order", "input_schema": ORDER}],  # type: ignore[list-item]
            tool_choice=choice,  # type: ignore[arg-type]
        )
        (use,) = [b for b in msg.content if b.type == "tool_use"]
        jsonschema.validate(use.input, ORDER)


def test_anthropic_tool_round_trip_plain_and_streamed(live: LiveServer) -> None:
    client = claude(live)
    tools: Any = [{"name": "get_weather", "description": "Weather now", "input_schema": WEATHER}]
    args: dict[str, Any] = dict(
        model="edge0-demo",
        max_tokens=60,
        messages=ASK,
        tools=tools,
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    msg = client.messages.create(**args)
    assert msg.stop_reason == "tool_use"
    (use,) = [b for b in msg.content if b.type == "tool_use"]
    assert use.name == "get_weather"
    jsonschema.validate(use.input, WEATHER)
    with client.messages.stream(**args) as stream:
        final = stream.get_final_message()
    (streamed,) = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and streamed.name == "get_weather"
    jsonschema.validate(streamed.input, WEATHER)  # rebuilt by the SDK from input_json_delta
    history: Any = [
        *ASK,
        {"role": "assistant", "content": [b.model_dump() for b in msg.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 C, sunny"}],
        },
    ]
    greedy: Any = {"temperature": 0.0}  # (Anthropic has no seed)
    answer = client.messages.create(
        model="edge0-demo",
        max_tokens=8,
        messages=history,
        tools=tools,
        tool_choice={"type": "none"},
        extra_body=greedy,
    )
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert answer.content[0].type == "text"
    again = dict(
        model="edge0-demo",
        max_tokens=8,
        messages=history,
        tools=tools,
        tool_choice={"type": "none"},
        extra_body=greedy,
    )
    with client.messages.stream(**again) as stream:
        assert "".join(stream.text_stream) == answer.content[0].text


def test_json_schema_output_validates_for_50_seeds(live: LiveServer) -> None:
    client = oai(live)
    fmt: Any = {
        "type": "json_schema",
        "json_schema": {"name": "person", "schema": PERSON, "strict": True},
    }
    texts = []
    for seed in range(0, 50, BATCH):  # BATCH choices per request, choice i seeded seed + i
        out = client.chat.completions.create(
            model="edge0-demo",
            messages=[{"role": "user", "content": "A person as JSON."}],
            response_format=fmt,
            max_tokens=80,
            temperature=1.0,
            seed=seed,
            n=BATCH,
        )
        texts += [c.message.content or "" for c in out.choices]
    assert len(texts) == 50
    for text in texts:
        jsonschema.validate(json.loads(text), PERSON)
    assert len(set(texts)) > 10  # the seeds do differ
    obj = client.chat.completions.create(
        model="edge0-demo",
        messages=ASK,
        max_tokens=40,
        seed=5,
        response_format={"type": "json_object"},
    )
    assert obj.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(obj.choices[0].message.content or ""), dict)


def test_logprobs_match_the_models_logits(live: LiveServer, model: Path) -> None:
    client = oai(live)
    out = client.chat.completions.create(
        model="edge0-demo", messages=ASK, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    content = out.choices[0].logprobs.content  # type: ignore[union-attr]
    tok = live.backend.engine.tokenizer
    prompt = tok.apply_chat_template(ASK, add_generation_prompt=True)
    gen = tok.encode(out.choices[0].message.content or "", add_special_tokens=False)
    loaded = load(model)
    logits = loaded.model(mx.array([list(prompt) + gen]))[0].astype(mx.float32)
    lp = np.array(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
    assert len(content) == len(gen) == 6
    for i, entry in enumerate(content):
        row = lp[len(prompt) - 1 + i]
        assert entry.logprob == pytest.approx(float(row[gen[i]]), abs=2e-3)
        assert entry.top_logprobs[0].logprob == pytest.approx(float(row.max()), abs=2e-3)
        assert entry.logprob == entry.top_logprobs[0].logprob  # greedy: the top token
        assert [t.logprob for t in entry.top_logprobs] == sorted(
            [t.logprob for t in entry.top_logprobs], reverse=True
        )
    streamed = client.chat.completions.create(
        model="edge0-demo",
        messages=ASK,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        stream=True,
    )
    entries = [
        e
        for c in streamed
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content or []
    ]
    assert [e.model_dump() for e in entries] == [e.model_dump() for e in content]
    comp = client.completions.create(
        model="edge0-demo", prompt="def main(", max_tokens=5, temperature=0, logprobs=2
    )
    lps = comp.choices[0].logprobs
    assert lps is not None and len(lps.token_logprobs or []) == 5
    assert "".join(lps.tokens or []) == comp.choices[0].text
    assert all(len(t) == 2 for t in lps.top_logprobs or [])


def test_n_choices_equal_seeded_single_requests(live: LiveServer) -> None:
    client = oai(live)
    args: dict[str, Any] = dict(model="edge0-demo", messages=ASK, max_tokens=12, temperature=1.0)
    many = client.chat.completions.create(**args, n=3, seed=11)
    singles = [client.chat.completions.create(**args, seed=11 + i) for i in range(3)]
    assert [c.index for c in many.choices] == [0, 1, 2]
    assert [c.message.content for c in many.choices] == [
        s.choices[0].message.content for s in singles
    ]
    assert len({c.message.content for c in many.choices}) > 1
    chunks = client.chat.completions.create(**args, n=3, seed=11, stream=True)
    texts = ["", "", ""]
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
    assert texts == [c.message.content for c in many.choices]
    comp = client.completions.create(
        model="edge0-demo", prompt="import", max_tokens=8, n=2, seed=4, temperature=1.0
    )
    assert len(comp.choices) == 2
    with pytest.raises(openai.BadRequestError, match="max-batch"):
        client.chat.completions.create(**args, n=BATCH + 1)


def test_a_constrained_request_decodes_in_one_batch_with_a_free_one(live: LiveServer) -> None:
    client = oai(live)
    free: dict[str, Any] = dict(model="edge0-demo", messages=ASK, max_tokens=24, seed=9)
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
    alone = client.chat.completions.create(**free).choices[0].message.content
    batcher = live.backend.engine.batcher
    steps_before = len(batcher.log)

    async def both() -> list[Any]:
        async with openai.AsyncOpenAI(
            base_url=f"{live.url}/v1", api_key=KEY, max_retries=0, timeout=120
        ) as aclient:
            return list(
                await asyncio.gather(
                    aclient.chat.completions.create(**free),
                    aclient.chat.completions.create(
                        model="edge0-demo", messages=ASK, max_tokens=80, seed=9, response_format=fmt
                    ),
                )
            )

    together, shaped = asyncio.run(both())
    assert together.choices[0].message.content == alone  # hint mode: batched = solo
    jsonschema.validate(json.loads(shaped.choices[0].message.content or ""), PERSON)
    assert any(s.rows == 2 for s in batcher.log[steps_before:])  # one step fed both
