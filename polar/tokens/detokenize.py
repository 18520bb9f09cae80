"""Incremental detokenization for streaming: text deltas as ids arrive, never half a UTF-8 character.

Decoding each new id on its own is wrong for byte-level BPE (a character can span ids, and the decoder
may join pieces); decoding everything every time is quadratic. Like vLLM and HF's TextStreamer, this keeps
a small window: the text of ids[prefix:read] is known to be emitted, the text of ids[prefix:] is decoded
again, and the difference is released once it no longer ends in a replacement character.
"""

from __future__ import annotations

from collections.abc import Iterable

from polar.tokens.tokenizer import ChatTokenizer


class IncrementalDecoder:
    def __init__(self, tokenizer: ChatTokenizer, *, skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # window start: ids before it are settled
        self._read = 0  # ids up to here have had their text emitted

    def _decode(self, start: int, end: int | None = None) -> str:
        return self._tokenizer.decode(self._ids[start:end], skip_special_tokens=self._skip)

    def feed(self, ids: Iterable[int]) -> str:
        """Add ids; return the newly completed text (possibly empty)."""
        self._ids.extend(ids)
        settled = self._decode(self._prefix, self._read)
        current = self._decode(self._prefix)
        if len(current) > len(settled) and not current.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self._ids)
            return current[len(settled) :]
        return ""

    def flush(self) -> str:
        """The text still held back (an incomplete character at the very end decodes as U+FFFD)."""
        settled = self._decode(self._prefix, self._read)
        current = self._decode(self._prefix)
        self._prefix = self._read = len(self._ids)
        return current[len(settled) :]
