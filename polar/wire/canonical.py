"""The canonical request and completion every protocol codec translates to and from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from polar.inference import FinishReason
from polar.tokens.messages import Message, ToolCall, ToolSpec


@dataclass(frozen=True)
class ChatRequest:
    """A model call, whatever protocol it arrived in.

    ``sampling`` holds SGLang-named parameters the caller set (temperature, top_p, top_k, stop, seed);
    fields the backend cannot honour (cache_control, metadata, tool_choice, reasoning effort, ...) are
    accepted by the codec and left out. ``max_tokens`` None means "as many as the context allows, up to
    the gateway's default".
    """

    model: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    max_tokens: int | None = None
    sampling: dict[str, Any] = field(default_factory=dict, hash=False)
    stream: bool = False


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Completion:
    """What the model produced, parsed: text, reasoning and tool calls, plus why it stopped."""

    id: str
    model: str
    created: int  # unix seconds
    content: str
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...]
    finish_reason: FinishReason
    usage: Usage
    matched_stop: int | str | None = None  # a stop *string* the caller asked for, when one matched
    malformed_tool_calls: int = 0  # tool-call blocks that did not parse (kept as text in ``content``)

    @property
    def stopped_on_sequence(self) -> bool:
        """True when a caller-given stop string ended the reply (Anthropic: stop_sequence)."""
        return self.finish_reason is FinishReason.STOP and isinstance(self.matched_stop, str)
