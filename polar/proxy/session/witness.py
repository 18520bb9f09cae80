"""Which of several equal replies a request continues: the ids the harness echoed are the witness.

A call sent again (a client timeout, a reply lost on the way) is generated again and kept as a sibling of the
first (``polar.trajectory.liveness``). When the siblings' replies are the same in content (the same text and tool
calls: greedy decoding, a short answer), the next request's history echoes every one of them alike, and content
alone cannot say which the harness kept. What does say it is what the gateway minted for each reply and the
harness sends back: each tool call's id (OpenAI ``tool_calls[].id`` and the tool result's ``tool_call_id``,
Anthropic ``tool_use.id`` / ``tool_result.tool_use_id``, Responses ``call_id``) and, where the protocol echoes
them, the reply's item ids (Responses ``msg_``/``rs_``/``fc_`` items). Those ids are unique to each capture and
read from its record (``polar.wire.replies.minted_ids``), so every gateway process decides alike.

Contract of ``single_out``: given the parent the content match found, when other known calls of the same depth
are extended by the request just as well, the one whose minted ids the request echoes (and no other's) becomes the
parent, and the choice is *witnessed* (the capture's admission cause ``echoed_ids`` says so, and the builders trust
it: ``polar.trajectory.liveness``). When no id, or more than one sibling's, is echoed, the content match stands
unwitnessed (the builders mask the siblings as ``ambiguous_witness`` when they would train differently).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from polar.tokens.matching import extension_start
from polar.tokens.messages import Message, ToolSpec
from polar.tokens.render import PriorCall


def echoed_ids(messages: Sequence[Message], start: int) -> frozenset[str]:
    """Every id the request echoes from ``start`` on: its assistant messages' tool-call and item ids, and the call
    ids its tool results answer."""
    out: set[str] = set()
    for message in messages[start:]:
        out.update(message.item_ids)
        out.update(call.id for call in message.tool_calls if call.id)
        if message.tool_call_id:
            out.add(message.tool_call_id)
    return frozenset(out)


def single_out(
    found: tuple[PriorCall, int],
    messages: Sequence[Message],
    tools: Sequence[ToolSpec],
    same_depth: Iterable[PriorCall],
) -> tuple[tuple[PriorCall, int], bool]:
    """The parent ``found`` (the content match, ``(call, start of the new messages)``), or the sibling the echoed
    ids single out, and whether ids decided it (module docstring). ``same_depth``: the known calls made with as
    many messages as ``found``'s call (``found``'s own included); in the steady state there is only it."""
    prior, start = found
    matches = [found]
    for other in same_depth:
        if other.ref == prior.ref:
            continue
        other_start = extension_start(messages, tools, other.messages, other.tools, other.reply)
        if other_start == start:
            matches.append((other, other_start))
    if len(matches) == 1:
        return found, False
    echoed = echoed_ids(messages, len(prior.messages))
    witnessed = [match for match in matches if match[0].minted & echoed]
    if len(witnessed) == 1:
        return witnessed[0], True
    return found, False
