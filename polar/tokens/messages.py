"""The canonical chat: what every provider protocol is translated into before rendering.

Tool-call arguments are kept as the JSON text the model (or the harness) wrote; comparisons use the parsed
value so that re-serialised echoes (``{"a":1}`` vs ``{"a": 1}``) still compare equal.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any


class Role(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as written by the model or echoed by the harness
    id: str | None = None

    @cached_property
    def _parsed(self) -> Any:
        try:
            return json.loads(self.arguments)
        except (json.JSONDecodeError, TypeError):
            return self.arguments

    def parsed_arguments(self) -> Any:
        """The arguments as a JSON value, or the raw text when it is not valid JSON (parsed once)."""
        return self._parsed


@dataclass(frozen=True)
class ToolSpec:
    """A function the model may call. ``parameters`` is a JSON schema.

    ``deferred``: declared (the model may call it, its calls parse) but not listed with the other tools at the
    top of the prompt: a tool search loads it, and the search's result shows its definition where it was loaded
    (Anthropic's ``defer_loading`` with ``tool_reference`` blocks). So loading one mid-conversation leaves the
    prompt so far unchanged, and the next call still extends the last."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict, hash=False)
    deferred: bool = False

    def as_json(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def shown_tools(tools: Sequence[ToolSpec]) -> tuple[ToolSpec, ...]:
    """The tools a prompt lists up front: all but the deferred ones."""
    return tuple(tool for tool in tools if not tool.deferred)


@dataclass(frozen=True)
class Message:
    role: Role
    content: str = ""
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None  # on tool results
    name: str | None = None  # tool name on tool results, when the protocol gives it
    # Ids of the provider items this message was echoed as (Responses: its message, reasoning and function-call
    # items), beside the tool-call ids: a witness of which earlier reply a harness echoed. Never compared.
    item_ids: tuple[str, ...] = field(default=(), compare=False)


def system(text: str) -> Message:
    return Message(Role.SYSTEM, text)


def user(text: str) -> Message:
    return Message(Role.USER, text)


def assistant(text: str = "", *, reasoning: str | None = None, tool_calls: tuple[ToolCall, ...] = ()) -> Message:
    return Message(Role.ASSISTANT, text, reasoning=reasoning, tool_calls=tool_calls)


def tool_result(text: str, call_id: str | None = None, name: str | None = None) -> Message:
    return Message(Role.TOOL, text, tool_call_id=call_id, name=name)
