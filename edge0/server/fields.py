"""Which request fields of each API the server honours, accepts without effect, or refuses.

Every field of the OpenAI and Anthropic request schemas is in one of three sets:
`SERVED` (read and acted on by edge0.server.schemas), `ACCEPTED` (no effect on a
local server's answer: end-user ids, metadata, caching hints) and `REFUSED` (a
feature Edge0 does not serve: any value but the listed no-op ones is a 400 naming
the field). Fields outside every set are not part of the API and are ignored.
docs/server.md has the same table; the tests walk the SDKs' schemas against it.
"""

from __future__ import annotations

from typing import Any

from edge0.errors import RequestError

_SAMPLING = {
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "n",
    "logprobs",
}
SERVED: dict[str, set[str]] = {
    "openai.chat": _SAMPLING
    | {
        "messages",
        "max_completion_tokens",
        "top_logprobs",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
    },
    "openai.completions": _SAMPLING | {"prompt"},
    "anthropic.messages": {
        "model",
        "max_tokens",
        "messages",
        "system",
        "temperature",
        "top_p",
        "top_k",
        "stop_sequences",
        "stream",
        "tools",
        "tool_choice",
    },
}
ACCEPTED: dict[str, set[str]] = {
    "openai.chat": {
        "user",
        "metadata",
        "safety_identifier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        "service_tier",
    },
    "openai.completions": {"user"},
    "anthropic.messages": {
        "metadata",
        "service_tier",
        "cache_control",
        "user_profile_id",
        "workspace_id",
        "inference_geo",
        "diagnostics",
    },
}
_OFF = (None, 0, 0.0)
# field -> (values that ask for nothing, what the field would need)
REFUSED: dict[str, dict[str, tuple[tuple[Any, ...], str]]] = {
    "openai.chat": {
        "presence_penalty": (_OFF, "other than 0"),
        "frequency_penalty": (_OFF, "other than 0"),
        "logit_bias": ((None, {}), "(token biases)"),
        "audio": ((None,), "(audio output)"),
        "modalities": ((None, ["text"]), 'other than ["text"]'),
        "prediction": ((None,), "(predicted outputs)"),
        "reasoning_effort": ((None,), "(reasoning models)"),
        "verbosity": ((None,), "(reasoning models)"),
        "web_search_options": ((None,), "(web search)"),
        "functions": ((None, []), "(the legacy form; send `tools`)"),
        "function_call": ((None, "none"), "(the legacy form; send `tool_choice`)"),
        "store": ((None, False), "(stored completions)"),
        "moderation": ((None,), "(moderation)"),
    },
    "openai.completions": {
        "presence_penalty": (_OFF, "other than 0"),
        "frequency_penalty": (_OFF, "other than 0"),
        "logit_bias": ((None, {}), "(token biases)"),
        "best_of": ((None, 1), "other than 1"),
        "echo": ((None, False), "(echoing the prompt)"),
        "suffix": ((None, ""), "(insertion)"),
    },
    "anthropic.messages": {
        "thinking": ((None, {"type": "disabled"}), "(extended thinking)"),
        "container": ((None,), "(code execution containers)"),
        "mcp_servers": ((None, []), "(MCP servers)"),
        "output_config": ((None, {}), "(output configuration)"),
        "context_management": ((None,), "(context management)"),
        "speed": ((None,), "(speed tiers)"),
    },
}


def refuse_unserved(body: dict[str, Any], api: str) -> None:
    """A RequestError for the first field `body` sets that the server does not serve."""
    for name, (off, what) in REFUSED[api].items():
        if name in body and not any(
            body[name] == v and type(body[name]) is type(v) or body[name] is v for v in off
        ):
            raise RequestError(f"`{name}` {what} is not supported by this server", param=name)
