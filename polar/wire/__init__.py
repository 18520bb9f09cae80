"""The wire protocols, below everything that reads or writes them (the gateway, trajectories, exports, the API).

- Codecs, one module per wire family, by the name stored in ``captures.protocol``: each decodes a provider's
  request into the canonical call (``canonical``) and encodes completions, streamed or not, in that provider's
  shape (errors included).
- ``body`` and ``json_guard``: reading a request body within size, depth and count limits.
"""

from __future__ import annotations

from polar.errors import InvalidRequest
from polar.wire.anthropic import CODEC as ANTHROPIC
from polar.wire.base import ProtocolCodec, StreamEncoder, StreamMeta, sse
from polar.wire.gemini import CODEC as GEMINI
from polar.wire.openai_chat import CODEC as OPENAI_CHAT
from polar.wire.openai_responses import CODEC as OPENAI_RESPONSES

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
