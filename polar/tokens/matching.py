"""Does a new request extend an earlier call's conversation?

Harnesses re-send the whole history on every call, echoing the model's earlier reply in their own way:
tool-call ids are rewritten (Gemini CLI: ``write_file_<ts>_0``), JSON arguments are re-serialised,
reasoning is dropped or kept, text and tool calls of one reply may come back as several assistant
messages, parallel calls may come back in another order (each with the id minted for it), whitespace around
text is trimmed, an echoed call gains arguments the model left out at their
declared schema defaults (Claude Code's Edit adds ``"replace_all": false``). The comparison here is semantic
so that none of these break append mode; anything that changes meaning (different text, different arguments, a different
tool list) does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from polar.tokens.messages import Message, Role, ToolCall, ToolSpec, shown_tools


def _same_calls(a: Sequence[ToolCall], b: Sequence[ToolCall]) -> bool:
    return len(a) == len(b) and all(
        x.name == y.name and x.parsed_arguments() == y.parsed_arguments() for x, y in zip(a, b, strict=True)
    )


def _defaults(tools: Sequence[ToolSpec]) -> dict[str, dict[str, Any]]:
    """Each tool's declared argument defaults (``parameters.properties.X.default``)."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools:
        props = tool.parameters.get("properties") if isinstance(tool.parameters, dict) else None
        if isinstance(props, dict):
            out[tool.name] = {k: v["default"] for k, v in props.items() if isinstance(v, dict) and "default" in v}
    return out


def _same_echoed_call(echo: ToolCall, sampled: ToolCall, defaults: dict[str, dict[str, Any]]) -> bool:
    """``echo`` is ``sampled`` as a harness sent it back: equal arguments, except that the echo may add arguments
    the model did not write whose values equal the tool schema's declared defaults."""
    if echo.name != sampled.name:
        return False
    a, b = echo.parsed_arguments(), sampled.parsed_arguments()
    if a == b:
        return True
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    declared = defaults.get(echo.name, {})
    added = {k: v for k, v in a.items() if k not in b}
    kept = {k: v for k, v in a.items() if k in b}
    return kept == b and all(k in declared and declared[k] == v for k, v in added.items())


def _calls_echoed(echo: Sequence[ToolCall], sampled: Sequence[ToolCall], defaults: dict[str, dict[str, Any]]) -> bool:
    """``echo`` is the reply's ``sampled`` calls sent back: in order, or in another order when each echoed call
    carries the id minted for the sampled call it repeats (parallel calls a harness reorders or splits)."""
    if len(echo) != len(sampled):
        return False
    if all(_same_echoed_call(x, y, defaults) for x, y in zip(echo, sampled, strict=True)):
        return True
    by_id = {call.id: call for call in sampled if call.id}
    if len(by_id) != len(sampled) or len({call.id for call in echo}) != len(echo):
        return False
    return all(call.id in by_id and _same_echoed_call(call, by_id[call.id], defaults) for call in echo)


def same_message(a: Message, b: Message) -> bool:
    """History equality: role, trimmed text, reasoning, tool calls by name and JSON-equal arguments.

    Tool-call ids are ignored: they are the harness's bookkeeping, not something the model saw. A sealed message
    (``Message.sealed``, a session history's) compares by its key, the digest of exactly these parts.
    """
    if a.digest is not None or b.digest is not None:
        return a.key == b.key
    return (
        a.role is b.role
        and a.content.strip() == b.content.strip()
        and (a.reasoning or "").strip() == (b.reasoning or "").strip()
        and _same_calls(a.tool_calls, b.tool_calls)
    )


def same_tools(a: Sequence[ToolSpec], b: Sequence[ToolSpec]) -> bool:
    """The same tools listed up front (deferred ones are shown where a tool search loads them, in a message)."""
    a, b = shown_tools(a), shown_tools(b)
    return len(a) == len(b) and all(
        x.name == y.name and x.description == y.description and x.parameters == y.parameters
        for x, y in zip(a, b, strict=True)
    )


def echo_length(messages: Sequence[Message], start: int, reply: Message, tools: Sequence[ToolSpec] = ()) -> int | None:
    """How many messages from ``start`` echo ``reply``; None when they do not.

    The echo is one or more consecutive assistant messages whose texts, joined, equal the reply's text and
    whose tool calls, concatenated, equal the reply's calls. Reasoning must match when the harness echoes
    it; a harness that drops reasoning still matches.
    """
    end = start
    while end < len(messages) and messages[end].role is Role.ASSISTANT:
        end += 1
    if end == start:
        return None
    defaults = _defaults(tools)
    # Prefer the shortest run that matches: a following assistant message may be a new turn of its own.
    for stop in range(start + 1, end + 1):
        run = messages[start:stop]
        text = "".join(m.content.strip() for m in run)
        reasoning = "".join((m.reasoning or "").strip() for m in run)
        calls = [c for m in run for c in m.tool_calls]
        if (
            text == reply.content.strip()
            and _calls_echoed(calls, reply.tool_calls, defaults)
            and (not reasoning or reasoning == (reply.reasoning or "").strip())
        ):
            return stop - start
    return None


def extension_start(
    messages: Sequence[Message],
    tools: Sequence[ToolSpec],
    prior_messages: Sequence[Message],
    prior_tools: Sequence[ToolSpec],
    prior_reply: Message,
) -> int | None:
    """Index of the first new message when ``messages`` = prior messages + echoed reply + new messages.

    Returns None when the request does not extend the prior call (history edited, tools changed, reply not
    echoed, or nothing new after the echo).
    """
    n = len(prior_messages)
    if len(messages) <= n or not same_tools(tools, prior_tools):
        return None
    head = messages[:n]
    # Equal messages (the same objects, in the steady state: a request decoded on the session's history shares its
    # sealed messages) compare in C; only a history that differs is compared message by message, by what matters.
    if head != prior_messages and not all(map(same_message, head, prior_messages)):
        return None
    echoed = echo_length(messages, n, prior_reply, tools)
    if echoed is None or n + echoed >= len(messages):
        return None
    return n + echoed
