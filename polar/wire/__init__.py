"""The wire protocols as pure codecs, below everything that reads or writes them (the gateway, trajectories,
exports, the rollout pipeline). Nothing here does I/O or knows about HTTP servers (``polar.httpserve`` reads
bodies; the gateway holds sessions).

- Codecs, one module per wire family, by the name stored in ``captures.protocol``: each decodes a provider's
  request into the canonical call (``canonical``) and encodes completions, streamed or not, in that provider's
  shape (errors included); ``base`` is the codec interface, ``tool_schema`` the tool schemas they share.
- ``replies``: a stored reply read back as a message, whichever codec wrote it.
- ``json_guard`` and ``body_digest``: the limits on a decoded JSON body, and the digests that tell which parts of
  a body repeat the previous one (what a codec's ``parse_extension`` is given).
- ``policy``: the scripted session policy's JSON, as tasks and the session API carry it.
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
