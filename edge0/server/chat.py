"""Chat messages to prompt token ids: the tokenizer's chat template, or a plain layout without one.

Without a template (the demo model has none), a lone user message is its text as
is (what `edge0 run -p TEXT` encodes), and a conversation is laid out as
`role: content` paragraphs ending in `assistant:`.
"""

from __future__ import annotations

from typing import Any

from edge0.errors import RequestError
from edge0.server.messages import Message


def plain_prompt(messages: list[Message]) -> str:
    """The prompt text for a tokenizer without a chat template."""
    if len(messages) == 1 and messages[0].role == "user":
        return messages[0].content
    return "\n\n".join(f"{m.role}: {m.content}" for m in messages) + "\n\nassistant:"


def chat_ids(
    tokenizer: Any, messages: list[Message], tools: list[dict[str, Any]] | None = None
) -> list[int]:
    """Token ids of the conversation, ready for the assistant's reply; `tools` (OpenAI form)
    go to the template, which lays them out as the model was taught."""
    if getattr(tokenizer, "has_chat_template", False):
        extra = {"tools": tools} if tools else {}
        try:
            ids = tokenizer.apply_chat_template(
                [m.template() for m in messages], add_generation_prompt=True, **extra
            )
        except Exception as exc:  # templates raise on roles or orders they do not take
            raise RequestError(
                f"the model's chat template refused these messages: {exc}", param="messages"
            ) from None
        return [int(i) for i in ids]
    return [int(i) for i in tokenizer.encode(plain_prompt(messages))]
