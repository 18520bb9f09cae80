"""A request body decoded under the gateway's checks, in the one order both the gateway and its screening process
(``polar.proxy.call.screen``) apply them:

    JSON decoded → the cost bound on its shape (tool and message counts, ``CostBound.refuse_shape``) → JSON limits
    (``check_json``) → the protocol's validation and conversion (``parse_after``) → the cost bound on its text

The shape comes before anything that works per message, so a body of 800,000 messages is refused having cost one
decode and one count. Blocking: the caller runs it where its size allows (``polar.proxy.call.intake``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from polar.proxy.call.cost import INLINE_CHARS, CostBound, counted_messages, message_chars, tool_chars
from polar.wire.base import ProtocolCodec, parse_after, parse_extended
from polar.wire.body_digest import BodyDigest
from polar.wire.canonical import ChatRequest
from polar.wire.json_guard import CutBody, JsonLimits, parse_json_after


@dataclass(frozen=True)
class Decoded:
    body: Any
    request: ChatRequest
    digest: BodyDigest | None  # set when it went the strict (orjson) way: it may spare the next call the same work
    tool_chars: int  # characters its tool definitions render (counted only for a body large enough to matter)
    cut: CutBody | None = None  # ``body`` lacks the leading messages the session's previous request held


@dataclass(frozen=True)
class Prior:
    """What a session's previous request (``polar.proxy.session.history.LastRequest``) spares this one: the digest
    of its body and its decode."""

    digest: BodyDigest
    request: ChatRequest


def decode_body(
    raw: bytes,
    codec: ProtocolCodec,
    limits: JsonLimits,
    bound: CostBound,
    *,
    path_model: str | None = None,
    path_stream: bool | None = None,
    count: bool = False,
    prior: Prior | None = None,
    digests: bool = False,
    whole_bound: bool = False,
) -> Decoded:
    """``raw`` decoded, checked and converted; raises the ``PolarError`` of the first check it fails (module
    docstring). ``count``: a token-count body (its protocol's defaults fill what it lacks). ``prior``: what the
    session's previous request spares (only what this body adds is checked and converted). ``digests``: the body's
    digest is wanted. ``whole_bound``: the cost bound on the whole conversation's text too (a body too large to
    pass it surely; the planner bounds what its build tokenizes anyway)."""
    counted = 0  # the messages the shape bound counted: kept with the digest for the next body, which may be cut

    def shape(value: Any, cut: int) -> None:
        nonlocal counted
        earlier = prior.digest.head.turns if cut and prior is not None and prior.digest.head is not None else 0
        counted = bound.refuse_shape(codec, value, earlier)

    key = codec.messages_field if digests and hasattr(codec, "parse_extension") else None
    parsed = parse_json_after(raw, limits, prior.digest if prior is not None else None, shape, digests=digests, key=key)
    body = parsed.value
    if count and isinstance(body, dict):
        body = {**codec.count_tokens_defaults, **body}
    known = (parsed.repeats, prior.request) if prior is not None and parsed.repeats is not None else None
    if parsed.cut is not None and known is not None:
        chat = parse_extended(codec, body, known[0], known[1], parsed.cut.count)
        if chat is None:  # it does not extend the previous request after all: decoded whole, as any body
            return decode_body(
                raw,
                codec,
                limits,
                bound,
                path_model=path_model,
                path_stream=path_stream,
                count=count,
                digests=digests,
                whole_bound=whole_bound,
            )
    else:
        chat = parse_after(codec, body, known, path_model=path_model, path_stream=path_stream)
    tools = tool_chars(chat.tools) if len(raw) > INLINE_CHARS else 0
    if whole_bound:
        bound.refuse(message_chars(chat.messages) + tools, counted_messages(chat.messages), codec.messages_field)
    digest = parsed.digest
    if digest is not None and digest.head is not None:
        digest = dataclasses.replace(digest, head=dataclasses.replace(digest.head, turns=counted))
    return Decoded(body, chat, digest, tools, parsed.cut)
