"""SFT conversations from captures: the messages and tools of a chain's last call, plus the reply it sampled.

The last capture of a trajectory's chain holds the whole conversation the harness sent (rebuilt from the stored
request deltas) and the reply's token ids; the reply is parsed with the gateway's own tool-call format, so the
exported assistant turn is what the harness received. Messages are OpenAI Chat shaped: ``role``, ``content``,
``tool_calls`` (``id``, ``type``, ``function: {name, arguments}``), ``tool_call_id``, ``name``, and the
reasoning as ``reasoning_content``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from db.models import Capture
from db.request_json import full_request_json
from polar.settings import Settings
from polar.tokens.messages import Message, Role, ToolSpec
from polar.wire import get_codec


def message_json(message: Message) -> dict[str, Any]:
    item: dict[str, Any] = {"role": message.role.value, "content": message.content}
    if message.reasoning:
        item["reasoning_content"] = message.reasoning
    if message.tool_calls:
        item["tool_calls"] = [
            {
                "id": call.id or f"call_{index}",
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for index, call in enumerate(message.tool_calls)
        ]
    if message.tool_call_id is not None:
        item["tool_call_id"] = message.tool_call_id
    if message.name is not None and message.role is Role.TOOL:
        item["name"] = message.name
    return item


def tools_json(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [tool.as_json() for tool in tools]


@dataclass
class ReplyParser:
    """Token ids of a reply -> the assistant message the gateway returned for them (the model family's parse)."""

    settings: Settings

    def __post_init__(self) -> None:
        from polar.chat import chat_format_for
        from polar.models.resolve import ModelChoice, resolve_model_folder

        self.format = chat_format_for(
            resolve_model_folder(ModelChoice.policy(self.settings)), self.settings.chat_format
        )

    def __call__(self, output_ids: Sequence[int]) -> Message:
        return self.format.parse(output_ids).message()


def conversation(
    db: Session, capture: Capture, parse_reply: ReplyParser
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(messages, tools) of the conversation ``capture`` continued, ending with its reply."""
    body = full_request_json(db, capture)
    request = get_codec(capture.protocol).parse_request(body, path_model=capture.model, path_stream=False)
    messages = [message_json(m) for m in request.messages]
    messages.append(message_json(parse_reply(capture.output_ids)))
    return messages, tools_json(request.tools)
