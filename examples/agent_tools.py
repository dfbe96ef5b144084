r"""An agent loop on `edge0 serve` with the official `openai` client: a tool call, its result,
the final answer, then an answer forced into a JSON schema.

The agent offers one local tool, `get_weather(city, unit)`. The demo model is tiny and
was never taught to call tools, so the agent asks for a call (`tool_choice="required"`):
the server's constrained decoding makes the model write a call that parses and
matches the tool's parameter schema. The agent runs the tool, sends its result back
as a `tool` message and takes the model's text answer (`tool_choice="none"`); a model
trained for tools would be left on `auto` and decide by itself. Last, a
`response_format` JSON schema: the answer is JSON that validates, whatever the model.

With no argument it starts `edge0 serve` on the demo model itself (a subprocess on a
free loopback port, stopped at the end); with a URL it talks to that server instead
(the key, if the server wants one, comes from EDGE0_API_KEY). It prints:

    server: http://127.0.0.1:PORT/v1 (started here | given)
    tool call: get_weather({"city": ..., "unit": ...}) [finish: tool_calls]
    tool result: {...}
    answer: <the model's text after the tool result>
    json: {"city": ..., "temperature": ..., "sunny": ...} (valid)

Run: python examples/agent_tools.py [http://127.0.0.1:8080]   (needs `pip install openai`)

ci-run:
ci-run: http://127.0.0.1:{port}
ci-serve: edge0 serve {demo} --port {port}
ci-expect: ^server: http://127\.0\.0\.1:\d+/v1 \((started here|given)\)$
ci-expect: ^tool call: get_weather\(\{"city": .*"unit": "(celsius|fahrenheit)"\}\) \[finish: tool_
ci-expect: \[finish: tool_calls\]$
ci-expect: ^tool result: \{"city": .*\}$
ci-expect: ^answer: .*
ci-expect: ^json: \{"city": .*\} \(valid\)$
ci-bad-args: --no-such-option
ci-bad-args: not-a-url
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import openai
from openai_client import edge0_server

WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather now in a city",
            "parameters": WEATHER_PARAMS,
        },
    }
]
REPORT = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "temperature": {"type": "integer", "minimum": -50, "maximum": 60},
        "sunny": {"type": "boolean"},
    },
    "required": ["city", "temperature", "sunny"],
    "additionalProperties": False,
}


def get_weather(city: str, unit: str) -> dict[str, Any]:
    """The agent's tool (a stand-in for a real weather service)."""
    celsius = 18
    return {
        "city": city,
        "temperature": celsius if unit == "celsius" else celsius * 9 // 5 + 32,
        "unit": unit,
        "sky": "sunny",
    }


def agent(base_url: str, how: str) -> None:
    print(f"server: {base_url} ({how})")
    client = openai.OpenAI(base_url=base_url, api_key=os.environ.get("EDGE0_API_KEY", "none"))
    model = client.models.list().data[0].id
    history: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    # 1. the model calls the tool
    first = client.chat.completions.create(
        model=model, messages=history, tools=TOOLS, tool_choice="required", max_tokens=80, seed=0
    )
    message = first.choices[0].message
    call = (message.tool_calls or [])[0]
    args = json.loads(call.function.arguments)
    print(
        f"tool call: {call.function.name}({json.dumps(args)}) "
        f"[finish: {first.choices[0].finish_reason}]"
    )
    # 2. the agent runs it and hands the result back
    result = get_weather(**args)
    print(f"tool result: {json.dumps(result)}")
    reply = {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)}
    history += [message.model_dump(exclude_none=True), reply]
    # 3. the model answers in text
    final = client.chat.completions.create(
        model=model, messages=history, tools=TOOLS, tool_choice="none", max_tokens=24, seed=0
    )
    print(f"answer: {final.choices[0].message.content!r}")
    # 4. an answer in a fixed JSON shape
    history.append({"role": "user", "content": "Sum it up as JSON."})
    shaped = client.chat.completions.create(
        model=model,
        messages=history,
        max_tokens=60,
        seed=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "report", "schema": REPORT, "strict": True},
        },
    )
    report = json.loads(shaped.choices[0].message.content or "")
    valid = set(report) == set(REPORT["required"]) and isinstance(report["sunny"], bool)
    print(f"json: {json.dumps(report)} ({'valid' if valid else 'INVALID'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", nargs="?", help="a running server, e.g. http://127.0.0.1:8080")
    args = parser.parse_args()
    if args.url is None:
        with edge0_server() as url:
            agent(url, "started here")
        return
    if not args.url.startswith(("http://", "https://")):
        parser.error(f"URL must start with http:// or https://, not {args.url!r}")
    agent(args.url.rstrip("/") + ("" if args.url.rstrip("/").endswith("/v1") else "/v1"), "given")


if __name__ == "__main__":
    main()
