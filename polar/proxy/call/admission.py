"""How a call enters its session's capture tree: ``root``, ``match`` or ``unresolved``, and why a root started.

The prompt builder (``polar.tokens.render``) finds the earlier call a request extends. This module judges the
request's history against what the session's captures really produced, so that nothing is absorbed silently:

- ``match``: the request extends a committed call (``found``) and every assistant message after that call's echo
  is explained by another known call's reply made in that very context (a merge claims that history). Its cause
  is ``echoed_ids`` when retried siblings' replies were echoed alike and the ids the harness echoed picked the
  parent (``polar.proxy.session.witness``), else none;
- ``unresolved``: the request holds assistant content no capture of the session produced in that context: an
  edited reply, an edited message before a reply, a reply whose commit failed and which the client kept. It is
  served (a harness must not break) but its chain is poisoned from it on (``polar.trajectory.liveness``). A
  root needs only each assistant message to be a known reply (it renders its history as the client's and trains
  only its own reply), so a harness that rebuilds its history from the model's replies (aider) stays trainable;
- ``root``: nothing explains it, and the cause says why: ``first_call``, ``earlier_calls_failed``,
  ``tools_changed``, ``system_changed``,
  ``reasoning_changed`` (the harness echoed other reasoning than was sampled), ``sub_agent`` (its first user
  message holds a tool-call argument an earlier call sampled), ``summarised`` (a user message holds an earlier
  reply's text), ``history_rebuilt`` (every assistant message is a known reply, but the history is not an
  extension of one call), ``resent`` (the same conversation again, with nothing new), ``new_conversation``.

A trailing assistant message (a prefill the model continues) is the client's text by definition and never makes
a call unresolved. Cost: a matched call checks only the messages after its parent's echo (usually none is an
assistant message); a root reads every known call (whose conversation it repeats, whose tool-call argument or
reply it holds) from the session's call nodes as held, its last message compared first
(``benchmarks/bench_root_calls.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from db.enums import Admission
from polar.tokens.matching import echo_length, same_message, same_tools
from polar.tokens.messages import Message, Role, ToolSpec
from polar.tokens.render import PriorCall

# A match's cause when several siblings' replies were echoed alike and the ids the gateway minted for one of them
# (its tool-call ids, its item ids) singled it out as the parent (``polar.proxy.session.witness``).
ECHOED_IDS = "echoed_ids"
MIN_ARGUMENT_CHARS = 16  # a tool-call string argument shorter than this is too common to link a sub-agent


class KnownCall(Protocol):
    """What admission reads of an earlier call: the conversation it was made with and its reply (a session's call
    nodes, ``polar.proxy.session.call_node.CallNode``, as they are: no prompt ids are built for a verdict)."""

    @property
    def messages(self) -> Sequence[Message]: ...

    @property
    def tools(self) -> Sequence[ToolSpec]: ...

    @property
    def reply(self) -> Message: ...


@dataclass(frozen=True)
class Verdict:
    admission: Admission
    cause: str | None = None


def admit(
    messages: Sequence[Message],
    tools: Sequence[ToolSpec],
    found: tuple[PriorCall, int] | None,
    known: Callable[[], Sequence[KnownCall]],
    *,
    first: bool = False,
    witnessed: bool = False,
) -> Verdict:
    """The verdict on a request (``messages``, ``tools``) whose parent search gave ``found``; ``known()`` gives the
    session's known calls (the committed, acknowledged ones), read only when needed; ``first``: the session has
    made no call at all before (not even a failed one). Only a first call may hold assistant messages no capture
    made (a harness's own examples): after a failed or unacknowledged call they may be a reply the store lost.
    ``witnessed``: ``found`` was singled out among equal siblings by the ids the request echoed (cause
    ``echoed_ids`` on the match)."""
    if found is not None:
        start = found[1]
        matched = Verdict(Admission.MATCH, ECHOED_IDS if witnessed else None)
        if not any(m.role is Role.ASSISTANT for m in messages[start:-1]):
            return matched  # the steady state: nothing to look up
        if _unexplained(messages, start, known(), in_context=True) is not None:
            return Verdict(Admission.UNRESOLVED, "history_edited")
        return matched
    calls = known()
    if not calls and first:
        return Verdict(Admission.ROOT, "first_call")
    if _unexplained(messages, 0, calls, in_context=False) is not None:
        return Verdict(Admission.UNRESOLVED, "history_edited")
    return Verdict(Admission.ROOT, _root_cause(messages, tools, calls))


def _by_depth(calls: Sequence[KnownCall]) -> dict[int, list[KnownCall]]:
    out: dict[int, list[KnownCall]] = {}
    for call in calls:
        out.setdefault(len(call.messages), []).append(call)
    return out


def _same_prefix(messages: Sequence[Message], prior: Sequence[Message]) -> bool:
    n = len(prior)
    if len(messages) < n:
        return False
    # The last message first: conversations sharing their opening (a system prompt) differ soonest there, and a
    # root is compared with every known call of its session.
    if n and not (messages[n - 1] is prior[n - 1] or same_message(messages[n - 1], prior[n - 1])):
        return False
    return all(a is b or same_message(a, b) for a, b in zip(messages, prior, strict=False))


def _without_reasoning(message: Message) -> Message:
    return Message(message.role, message.content, None, message.tool_calls)


def _unexplained(
    messages: Sequence[Message], start: int, calls: Sequence[KnownCall], *, in_context: bool
) -> int | None:
    """The index of the first assistant message at or after ``start`` that no known call's reply explains (a
    trailing one, a prefill, excepted); None when all are explained. ``in_context``: the explaining call must have
    been made with the very messages before it (a call merged into a chain claims them as its history); else any
    known reply explains it (a root renders its history as the client's, and trains only its own reply).
    Reasoning is not compared: an echo with other reasoning is the model's reply re-told (a root cause)."""
    last = len(messages) - 1
    i = start
    depth: dict[int, list[KnownCall]] | None = None
    while i < last:
        if messages[i].role is not Role.ASSISTANT:
            i += 1
            continue
        depth = depth if depth is not None else _by_depth(calls)
        run = None
        stripped = [*messages[:i], *(_without_reasoning(m) for m in messages[i:])]
        for prior in depth.get(i, ()) if in_context else calls:
            if in_context and not _same_prefix(messages, prior.messages):
                continue
            run = echo_length(stripped, i, _without_reasoning(prior.reply), prior.tools)
            if run is not None:
                break
        if run is None:
            return i
        i += run
    return None


def _root_cause(messages: Sequence[Message], tools: Sequence[ToolSpec], calls: Sequence[KnownCall]) -> str:
    """Why a request every assistant message of which is explained still extends no call."""
    if not calls:
        return "earlier_calls_failed"  # only failed or unacknowledged calls came before
    # The deepest call whose conversation the request repeats: what changed since it?
    for prior in sorted(calls, key=lambda c: len(c.messages), reverse=True):
        n = len(prior.messages)
        if not _same_prefix(messages, prior.messages):
            continue
        if not same_tools(tools, prior.tools):
            return "tools_changed"
        if n < len(messages) and messages[n].role is Role.ASSISTANT:
            echoed = echo_length(messages, n, prior.reply, tools)
            if echoed is None:
                return "reasoning_changed"  # explained but for reasoning (``_unexplained`` compared without it)
            if n + echoed >= len(messages):
                return "resent"
        if n == len(messages):
            return "resent"
        return "reply_dropped"  # the reply was not echoed: the harness went on without it
    has_assistant = any(m.role is Role.ASSISTANT for m in messages)
    if not has_assistant:
        first_user = next((m for m in messages if m.role is Role.USER), None)
        if first_user is not None and _holds_argument(first_user.content, calls):
            return "sub_agent"
    if any(m.role is Role.USER and _holds_reply(m.content, calls) for m in messages):
        return "summarised"
    if has_assistant:
        return "history_rebuilt"
    latest = max(calls, key=lambda c: len(c.messages))
    system = _system(messages)
    if system is not None and system != _system(latest.messages) and same_tools(tools, latest.tools):
        return "system_changed"
    if not same_tools(tools, latest.tools) and system == _system(latest.messages):
        return "tools_changed"
    return "new_conversation"


def _system(messages: Sequence[Message]) -> str | None:
    return messages[0].content if messages and messages[0].role is Role.SYSTEM else None


def _holds_argument(text: str, calls: Sequence[KnownCall]) -> bool:
    for call in calls:
        for tool_call in call.reply.tool_calls:
            args = tool_call.parsed_arguments()  # parsed once per reply, not once per later root
            values = args.values() if isinstance(args, dict) else ()
            if any(isinstance(v, str) and len(v) >= MIN_ARGUMENT_CHARS and v in text for v in values):
                return True
    return False


def _holds_reply(text: str, calls: Sequence[KnownCall]) -> bool:
    return any(len(reply) >= MIN_ARGUMENT_CHARS and reply in text for reply in (c.reply.content.strip() for c in calls))
