"""Prompt ids as the JSON array an engine's generate endpoint takes, built a turn at a time.

An append-mode prompt is the previous call's prompt and output followed by the turn's new ids, so its JSON text is
the text of those earlier ids, a comma, and the new ids' text. A session's line (``polar.proxy.session.call_node``)
keeps its ids' text as pieces, one per extension, each encoded once (with the comma that joins it to the one
before); a prompt's text is then those pieces and its new ids' piece, joined once by the sender with the rest of
its body: a long session's turn encodes its new ids, not its whole prompt again. ``json_array`` makes the parts
of a prompt encoded whole.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence

import numpy as np
import orjson


def ids_text(ids: Sequence[int] | np.ndarray) -> bytes:
    """``ids`` as JSON numbers joined by commas, without brackets (``b""`` for none): ``orjson.dumps(list(ids))``
    less its first and last byte. A numpy array, or an int32 array read in place by numpy, is encoded without an
    object per id."""
    if not len(ids):
        return b""
    if isinstance(ids, array) and ids.typecode == "i":
        ids = np.frombuffer(ids, dtype=np.int32)
    if isinstance(ids, np.ndarray):
        return orjson.dumps(ids, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1]
    return orjson.dumps(list(ids))[1:-1]


def json_array(pieces: Iterable[bytes]) -> tuple[bytes, ...]:
    """The parts of one JSON array holding ``pieces`` (each from ``ids_text``) in order, empty ones left out:
    ``b"".join`` of the result is the array's text, the same bytes as ``orjson.dumps`` of the ids."""
    parts = [b"["]
    for piece in pieces:
        if piece:
            if len(parts) > 1:
                parts.append(b",")
            parts.append(piece)
    parts.append(b"]")
    return tuple(parts)
