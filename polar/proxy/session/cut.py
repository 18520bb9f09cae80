"""Replies their clients cut mid-stream, as admission reads them.

A stream whose client left before its last frame is committed as an ``UNACKNOWLEDGED`` capture holding the ids
sampled so far (``polar.proxy.call.record.CallRecorder.cut``): never trained, never a parent. A client may still
keep the text it got and send it back as an assistant message; that text is the model's, not the client's. The
session's history keeps the latest few cut replies (``SessionHistory.cut``) so that admission
(``polar.proxy.call.admission``) recognises such a message by its context and its text (a prefix of the cut
reply's) and says so (cause ``reply_cut``) instead of taking it for the client's own words.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from polar.tokens.messages import Message, ToolSpec

KEEP = 4  # cut replies kept per session: a client that keeps partial text sends it back on its next call


@dataclass(frozen=True)
class CutReply:
    """A reply cut mid-stream: the conversation it answered (sealed), its tools, and the partial reply parsed from
    the ids sampled before the cut (its text, whole: the client kept a prefix of it)."""

    capture_id: int | None  # its UNACKNOWLEDGED capture (None: the store did not take it)
    messages: Sequence[Message]
    tools: Sequence[ToolSpec]
    reply: Message


def explains(cut: CutReply, message: Message) -> bool:
    """Whether ``message`` (an assistant message of a later request) is text the client kept of ``cut``: no tool
    call (a cut stream's calls are unfinished), and its text and reasoning each a prefix of the cut reply's."""
    text = message.content.strip()
    reasoning = (message.reasoning or "").strip()
    if message.tool_calls or not (text or reasoning):
        return False
    return cut.reply.content.strip().startswith(text) and (cut.reply.reasoning or "").strip().startswith(reasoning)
