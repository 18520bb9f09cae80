"""Protocol codecs, one module per wire family, by the name stored in ``captures.protocol``."""

from __future__ import annotations

from polar.errors import InvalidRequest
from polar.proxy.protocols.anthropic import CODEC as ANTHROPIC
from polar.proxy.protocols.base import ProtocolCodec, StreamEncoder, StreamMeta, sse
from polar.proxy.protocols.gemini import CODEC as GEMINI
from polar.proxy.protocols.openai_chat import CODEC as OPENAI_CHAT
from polar.proxy.protocols.openai_responses import CODEC as OPENAI_RESPONSES

CODECS: dict[str, ProtocolCodec] = {c.name: c for c in (OPENAI_CHAT, OPENAI_RESPONSES, ANTHROPIC, GEMINI)}


def get_codec(name: str) -> ProtocolCodec:
    if name not in CODECS:
        raise InvalidRequest(f"unknown protocol {name!r}; known: {', '.join(CODECS)}", field="protocol")
    return CODECS[name]


__all__ = [
    "ANTHROPIC",
    "CODECS",
    "GEMINI",
    "OPENAI_CHAT",
    "OPENAI_RESPONSES",
    "ProtocolCodec",
    "StreamEncoder",
    "StreamMeta",
    "get_codec",
    "sse",
]
