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
- a reply the client cut mid-stream (``polar.proxy.session.cut``) whose partial text the client kept: that
  assistant message is the model's text, not the client's, and not a reply to train either (its capture is
  ``UNACKNOWLEDGED``). It explains the message in the very context it was cut from, and the cause says so:
  ``reply_cut`` (a ``root`` when no committed call is extended, else on the ``match``);
- ``root``: nothing explains it, and the cause says why: ``first_call``, ``earlier_calls_failed``,
  ``tools_changed``, ``system_changed`` (against every agent of the session),
  ``reasoning_changed`` (the harness echoed other reasoning than was sampled), ``sub_agent`` (its first user
  message holds a tool-call argument an earlier call sampled), ``summarised`` (a user message holds an earlier
  reply's text), ``history_rebuilt`` (every assistant message is a known reply, but the history is not an
  extension of one call), ``resent`` (the same conversation again, with nothing new), ``new_conversation``;
- a root that extends a committed call (``found``) but holds, after its echo, known replies made in another
  context: the client changed its own text (poison is only for content the model is claimed to have produced
  and did not). The cause names the change before the first such reply: ``tool_output_changed`` (a tool output
  shortened in place), ``user_turn_changed``, ``system_changed``, ``messages_dropped`` (an exchange or a message
  left out), ``messages_added``. The call trains on; the replies in its history are context there, trained
  where they were sampled.

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
from polar.proxy.session.cut import CutReply, explains
from polar.tokens.matching import echo_length, same_message, same_tools
from polar.tokens.messages import Message, Role, ToolSpec
from polar.tokens.render import PriorCall

# A match's cause when several siblings' replies were echoed alike and the ids the gateway minted for one of them
# (its tool-call ids, its item ids) singled it out as the parent (``polar.proxy.session.witness``).
ECHOED_IDS = "echoed_ids"
# A call whose history holds the partial text of a reply its client cut mid-stream (``polar.proxy.session.cut``).
REPLY_CUT = "reply_cut"
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
    cut: Sequence[CutReply] = (),
) -> Verdict:
    """The verdict on a request (``messages``, ``tools``) whose parent search gave ``found``; ``known()`` gives the
    session's known calls (the committed, acknowledged ones), read only when needed; ``first``: the session has
    made no call at all before (not even a failed one). Only a first call may hold assistant messages no capture
    made (a harness's own examples): after a failed or unacknowledged call they may be a reply the store lost.
    ``witnessed``: ``found`` was singled out among equal siblings by the ids the request echoed (cause
    ``echoed_ids`` on the match). ``cut``: the session's replies cut mid-stream, whose kept text explains an
    assistant message in the context it was cut from (cause ``reply_cut``)."""
    if found is not None:
        start = found[1]
        matched = Verdict(Admission.MATCH, ECHOED_IDS if witnessed else None)
        if not any(m.role is Role.ASSISTANT for m in messages[start:-1]):
            return matched  # the steady state: nothing to look up
        calls = known()
        gap, kept_cut = _unexplained(messages, start, calls, in_context=True, cut=cut)
        if gap is None:
            return Verdict(Admission.MATCH, REPLY_CUT) if kept_cut and not witnessed else matched
        # The model's own replies, made in another context: the client changed its own text around them.
        if _unexplained(messages, gap, calls, in_context=False, cut=cut)[0] is None:
            return Verdict(Admission.ROOT, _changed_context(messages, gap, calls))
        return Verdict(Admission.UNRESOLVED, "history_edited")
    calls = known()
    if not calls and first and not cut:
        return Verdict(Admission.ROOT, "first_call")
    gap, kept_cut = _unexplained(messages, 0, calls, in_context=False, cut=cut)
    if gap is not None:
        return Verdict(Admission.UNRESOLVED, "history_edited")
    return Verdict(Admission.ROOT, REPLY_CUT if kept_cut else _root_cause(messages, tools, calls))


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
    # ``_alike`` written inline: this compares a root with every known call, message by message.
    if n and not (messages[n - 1] is prior[n - 1] or same_message(messages[n - 1], prior[n - 1])):
        return False
    return all(a is b or same_message(a, b) for a, b in zip(messages, prior, strict=False))


def _alike(a: Message, b: Message) -> bool:
    """History equality (``same_message``), by identity first: a history's sealed messages are shared objects."""
    return a is b or same_message(a, b)


def _without_reasoning(message: Message) -> Message:
    return Message(message.role, message.content, None, message.tool_calls)


def _stripped_from(messages: Sequence[Message], i: int) -> list[Message]:
    """``messages`` with the reasoning of ``messages[i:]`` dropped (an echo is then compared without it)."""
    return [*messages[:i], *(_without_reasoning(m) for m in messages[i:])]


def _unexplained(
    messages: Sequence[Message],
    start: int,
    calls: Sequence[KnownCall],
    *,
    in_context: bool,
    cut: Sequence[CutReply] = (),
) -> tuple[int | None, bool]:
    """The index of the first assistant message at or after ``start`` that no known call's reply explains (a
    trailing one, a prefill, excepted), or None when all are explained; and whether a cut reply's kept text
    explained one (``cut``: always in its own context). ``in_context``: the explaining call must have been made
    with the very messages before it (a call merged into a chain claims them as its history); else any known
    reply explains it (a root renders its history as the client's, and trains only its own reply). Reasoning is
    not compared: an echo with other reasoning is the model's reply re-told (a root cause)."""
    last = len(messages) - 1
    i = start
    depth: dict[int, list[KnownCall]] | None = None
    kept_cut = False
    while i < last:
        if messages[i].role is not Role.ASSISTANT:
            i += 1
            continue
        depth = depth if depth is not None else _by_depth(calls)
        run = None
        stripped = _stripped_from(messages, i)
        for prior in depth.get(i, ()) if in_context else calls:
            if in_context and not _same_prefix(messages, prior.messages):
                continue
            run = echo_length(stripped, i, _without_reasoning(prior.reply), prior.tools)
            if run is not None:
                break
        if run is None and any(
            len(c.messages) == i and _same_prefix(messages, c.messages) and explains(c, messages[i]) for c in cut
        ):
            run, kept_cut = 1, True
        if run is None:
            return i, kept_cut
        i += run
    return None, kept_cut


def _root_cause(messages: Sequence[Message], tools: Sequence[ToolSpec], calls: Sequence[KnownCall]) -> str:
    """Why a request every assistant message of which is explained still extends no call."""
    if not calls:
        return "earlier_calls_failed"  # only failed or unacknowledged calls came before
    # The deepest calls whose conversation the request repeats: what changed since them?
    depth = _by_depth([c for c in calls if _same_prefix(messages, c.messages)])
    if depth:
        n = max(depth)
        priors = depth[n]
        if not any(same_tools(tools, prior.tools) for prior in priors):
            return "tools_changed"
        if n == len(messages):
            return "resent"
        prefill = messages[n] if n == len(messages) - 1 and messages[n].role is Role.ASSISTANT else None
        if prefill is not None and any(p.reply.content.startswith(prefill.content) for p in priors):  # a known one
            return "resent"
        if messages[n].role is not Role.ASSISTANT:
            return "reply_dropped"  # the reply was not echoed: the harness went on without it
        stripped = _stripped_from(messages, n)
        for prior in priors:
            echoed = echo_length(messages, n, prior.reply, tools)
            if echoed is not None:
                return "resent" if n + echoed >= len(messages) else "history_rebuilt"
            if echo_length(stripped, n, _without_reasoning(prior.reply), tools) is not None:
                return "reasoning_changed"  # explained but for reasoning (``_unexplained`` compared without it)
        return "messages_dropped"  # another call's reply follows: the exchange between them was dropped
    has_assistant = any(m.role is Role.ASSISTANT for m in messages)
    if not has_assistant:
        first_user = next((m for m in messages if m.role is Role.USER), None)
        if first_user is not None and _holds_argument(first_user.content, calls):
            return "sub_agent"
    if any(m.role is Role.USER and _holds_reply(m.content, calls) for m in messages):
        return "summarised"
    if has_assistant:
        return "history_rebuilt"
    # Against every agent of the session, not only the one with the longest conversation.
    same_system = any(_same_system(messages, call.messages) for call in calls)
    same_toolset = any(same_tools(tools, call.tools) for call in calls)
    if _system(messages) is not None and not same_system and same_toolset:
        return "system_changed"
    if same_system and not same_toolset:
        return "tools_changed"
    return "new_conversation"


def _changed_context(messages: Sequence[Message], i: int, calls: Sequence[KnownCall]) -> str:
    """What the client changed before ``messages[i]``, a known reply made in another context (of the calls whose
    reply it is, the one whose context the request follows longest): the first of the client's messages that
    differs from that call's (``tool_output_changed``, ``user_turn_changed``, ``system_changed``), or
    ``messages_dropped`` / ``messages_added`` when a message is missing or extra."""
    stripped = _stripped_from(messages, i)
    best: tuple[int, int, str] | None = None
    for call in calls:
        if echo_length(stripped, i, _without_reasoning(call.reply), call.tools) is None:
            continue
        before = call.messages
        same = 0
        while same < min(i, len(before)) and _alike(messages[same], before[same]):
            same += 1
        mine, theirs = messages[same:i], before[same:]
        if len(mine) != len(theirs) and _ends_alike(mine, theirs):
            cause = "messages_dropped" if len(mine) < len(theirs) else "messages_added"
        elif mine and theirs and mine[0].role is theirs[0].role:
            cause = _CHANGED.get(mine[0].role, "history_changed")
        else:
            cause = "history_changed"
        if best is None or (same, len(before)) > best[:2]:
            best = (same, len(before), cause)
    return best[2] if best is not None else "history_changed"


def _ends_alike(a: Sequence[Message], b: Sequence[Message]) -> bool:
    """Whether the shorter of ``a`` and ``b`` is the end of the longer (what lies between was left out)."""
    short, long = (a, b) if len(a) <= len(b) else (b, a)
    return all(_alike(x, y) for x, y in zip(short, long[len(long) - len(short) :], strict=True))


_CHANGED = {Role.TOOL: "tool_output_changed", Role.USER: "user_turn_changed", Role.SYSTEM: "system_changed"}


def _system(messages: Sequence[Message]) -> Message | None:
    return messages[0] if messages and messages[0].role is Role.SYSTEM else None


def _same_system(a: Sequence[Message], b: Sequence[Message]) -> bool:
    """Whether two conversations open with the same system prompt, or both with none (a known call's messages
    are compared as held: ``same_message``, not their text)."""
    x, y = _system(a), _system(b)
    return x is y or (x is not None and y is not None and _alike(x, y))


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
