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

from polar.digest import digest_parts


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
    # Set on a sealed message only (``sealed``): the ``key`` of the message it stands for, whose text it dropped.
    digest: bytes | None = field(default=None, repr=False)

    @cached_property
    def key(self) -> bytes:
        """A digest of what history matching compares (``polar.tokens.matching.same_message``): the role, the
        trimmed text and reasoning, and each tool call's name and arguments as a JSON value (key order, spacing and
        ``1.0`` for ``1`` do not count; tool-call ids are not part of it)."""
        if self.digest is not None:
            return self.digest
        parts = [self.role.value, self.content.strip(), (self.reasoning or "").strip()]
        for call in self.tool_calls:
            parts += [call.name, _canonical_json(call.parsed_arguments())]
        return digest_parts(*parts)

    @cached_property
    def sealed(self) -> Message:
        """This message as a session's history keeps it: its ``key``, its role and its ids (tool calls' names and
        ids, the tool call it answers, provider item ids), without its text. A history holds its calls' messages
        sealed, so a session costs its token ids and not its conversation's text as well; matching compares a
        sealed message by its key, and nothing renders one (``polar.tokens.render.SealedText``). The same object
        every time: a request decoded on top of the history shares its sealed messages by identity."""
        if self.digest is not None:
            return self
        calls = tuple(ToolCall(call.name, "", call.id) for call in self.tool_calls)
        return Message(self.role, "", None, calls, self.tool_call_id, self.name, self.item_ids, self.key)


def _canonical_json(value: Any) -> str:
    """``value`` serialised so that values Python compares equal (a float equal to an integer, objects with
    their keys in another order) serialise alike."""

    def normal(v: Any) -> Any:
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, dict):
            return {str(k): normal(x) for k, x in v.items()}
        if isinstance(v, list):
            return [normal(x) for x in v]
        return v

    return json.dumps(normal(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def system(text: str) -> Message:
    return Message(Role.SYSTEM, text)


def user(text: str) -> Message:
    return Message(Role.USER, text)


def assistant(text: str = "", *, reasoning: str | None = None, tool_calls: tuple[ToolCall, ...] = ()) -> Message:
    return Message(Role.ASSISTANT, text, reasoning=reasoning, tool_calls=tool_calls)


def tool_result(text: str, call_id: str | None = None, name: str | None = None) -> Message:
    return Message(Role.TOOL, text, tool_call_id=call_id, name=name)
