"""The scripted session policy as it travels: in a task's ``policies`` and on the session API (``policy``).

A scripted policy answers a session's calls from a script instead of sampling (tests, demos, harness
fixtures); the gateway plays it (``polar.proxy.call.policy.ScriptedPolicy``). This is only its JSON, validated.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from polar.errors import invalid_from
from polar.tokens.messages import Message, Role, ToolCall


class ScriptedToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ScriptedReply(BaseModel):
    model_config = ConfigDict(extra="forbid")
    content: str = ""
    reasoning: str | None = None
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)

    def message(self) -> Message:
        calls = tuple(
            ToolCall(c.name, json.dumps(c.arguments, ensure_ascii=False), f"call_{i}")
            for i, c in enumerate(self.tool_calls)
        )
        return Message(Role.ASSISTANT, self.content, reasoning=self.reasoning, tool_calls=calls)


class ScriptedPolicySpec(BaseModel):
    """``replies`` answer the session's calls that offer tools, in order; calls without tools get
    ``tool_free_replies`` in order (a text-action agent such as mini-swe-agent's text mode: THOUGHT and one bash
    block per reply), then ``tool_free_reply`` (title generation, routers, memory extraction); once the tool
    script is used up, ``then``."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["scripted"]
    replies: list[ScriptedReply] = Field(default_factory=list)
    tool_free_replies: list[ScriptedReply] = Field(default_factory=list)
    tool_free_reply: str = "Polar session"
    then: str = "Done."
    delay_s: float = Field(default=0.0, ge=0, le=3600, description="each reply held this long first (a slow server)")

    @classmethod
    def parse(cls, raw: Any) -> ScriptedPolicySpec:
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            raise invalid_from(exc, "policy", prefix="policy") from None
