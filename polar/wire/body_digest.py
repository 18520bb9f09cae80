"""Which parts of a session's request repeat its previous one, known without keeping the previous one's text.

An agent re-sends its whole conversation on every turn, and the gateway checks and decodes only what a request
adds. It used to find that out by comparing with the session's previous body, kept whole: the conversation's
text, held as Python strings (one to four bytes a character), outweighed the session's token ids. A session now
keeps a ``BodyDigest`` per remembered body instead: a 128-bit digest of each top-level value and of each item of
a list value (the messages), about 16 bytes a message.

- A digest is of the value's serialisation by orjson (``polar.digest``), so equal digests mean equal JSON values.
- Equal values serialised differently (the keys of an object in another order) get other digests: they count as
  new, which costs work, never a wrong answer.

A strict body's digest may also keep its conversation's place in the raw bytes (``RawHead``): where the client
writes the list as orjson does (compact, as ``JSON.stringify`` and httpx do), the next body's bytes up to that
place are compared by one digest, and only what follows is decoded (``cut_repeated``): a turn's decode costs what
it adds, not its whole history.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from polar.digest import DIGEST_BYTES, digest, digest_joined


@dataclass(frozen=True)
class RawHead:
    """Where a strict body's list at ``key`` lies in the body's raw bytes: its ``[`` at ``start``, its last item
    ending at ``end`` (its ``]`` is there), and ``digest`` of ``raw[:end]``. Kept only when the list's bytes are
    exactly its orjson serialisation (checked when it is made), so ``raw[start:end] + b"]"`` is that serialisation.
    ``turns``: what the codec's shape count (``count_messages``) gives for the whole body's list (set by the
    decoder, which knows the codec)."""

    key: str
    items: int
    start: int
    end: int
    digest: bytes
    turns: int = 0


@dataclass(frozen=True)
class BodyDigest:
    """A decoded JSON object's digests: ``values`` per top-level key (of the value's serialisation, a list's as
    well); ``items`` per list-valued key, its items' digests concatenated (``DIGEST_BYTES`` each)."""

    values: dict[str, bytes]
    items: dict[str, bytes]
    head: RawHead | None = None  # where the body's conversation lies in its raw bytes, when that is known

    def repeats(self, earlier: BodyDigest | None) -> Repeats:
        """What this body repeats of ``earlier``'s (nothing when there is no earlier body)."""
        if earlier is None:
            return Repeats({}, frozenset(), frozenset())
        parts: dict[str, int] = {}
        for key, value in self.values.items():
            old = earlier.values.get(key)
            if old is None:
                continue
            if value == old:
                parts[key] = -1
                continue
            new_items, old_items = self.items.get(key), earlier.items.get(key)
            if new_items is not None and old_items and len(old_items) < len(new_items):
                if new_items.startswith(old_items):
                    parts[key] = len(old_items) // DIGEST_BYTES
        return Repeats(parts, frozenset(self.values), frozenset(earlier.values))


@dataclass(frozen=True)
class Repeats:
    """What a body repeats of an earlier one: ``parts`` maps a top-level key to -1 (the same value) or to how many
    leading items of its list equal the earlier list, all of it (a list the body extends)."""

    parts: dict[str, int]
    keys: frozenset[str]  # the body's top-level keys
    earlier_keys: frozenset[str]

    def same(self, key: str) -> bool:
        """The same value at ``key`` in both bodies, or absent from both."""
        if key in self.keys or key in self.earlier_keys:
            return self.parts.get(key) == -1
        return True

    def kept(self, key: str) -> int:
        """How many leading items of the list at ``key`` extend the earlier body's list (0: it does not)."""
        return max(self.parts.get(key, 0), 0)

    def same_keys(self) -> list[str]:
        """The keys present in both bodies with the same value."""
        return [key for key, count in self.parts.items() if count == -1]

    def kept_counts(self) -> dict[str, int]:
        """The list keys whose leading items extend the earlier body's list, and how many."""
        return {key: count for key, count in self.parts.items() if count > 0}


def body_digest(
    body: Any, earlier: BodyDigest | None = None, *, raw: bytes | None = None, key: str | None = None, cut: int = 0
) -> BodyDigest | None:
    """``body``'s digests; None when it is no JSON object or cannot be serialised (nested past orjson's limit).

    ``earlier``: the digest of a body this one likely extends (the session's previous request). A list that starts
    with all of that body's list (an agent's conversation, re-sent) is then serialised once for its leading items
    and once for the rest, and only the new items are digested one by one: the leading items' digests are the
    earlier list's. Otherwise each item is digested.

    ``raw`` and ``key``: the bytes ``body`` was decoded from, and its conversation's key: the digest then keeps the
    list's place in them (``RawHead``) where the client wrote it as orjson does. ``cut``: ``body`` was decoded
    from ``raw`` without the first ``cut`` items of that list (``cut_repeated`` on ``earlier.head``), which are
    ``earlier``'s whole list."""
    if not isinstance(body, dict):
        return None
    values: dict[str, bytes] = {}
    items: dict[str, bytes] = {}
    head: RawHead | None = None
    try:
        for name, value in body.items():
            if isinstance(value, list):
                start: bytes | memoryview
                if cut and name == key and earlier is not None and earlier.head is not None and raw is not None:
                    kept, start = cut, memoryview(raw)[earlier.head.start : earlier.head.end]
                    texts = [orjson.dumps(item) for item in value]
                else:
                    kept, start = _kept(value, name, earlier)
                    texts = [orjson.dumps(item) for item in value[kept:]]
                items[name] = (earlier.items[name] if earlier and kept else b"") + b"".join([digest(t) for t in texts])
                rest = b",".join(texts)
                values[name] = digest_joined(start, b"," if kept and texts else b"", rest, b"]")
                if name == key and raw is not None:
                    head = _raw_head(raw, body, name, kept + len(texts), start, rest, earlier if cut else None)
            else:
                values[name] = digest(orjson.dumps(value))
    except (orjson.JSONEncodeError, TypeError):
        return None
    return BodyDigest(values, items, head)


def _kept(value: list[Any], key: str, earlier: BodyDigest | None) -> tuple[int, bytes]:
    """How many leading items of ``value`` are all of ``earlier``'s list at ``key`` (0 when they are not), and the
    start of ``value``'s serialisation before the rest: ``[`` and those items' text."""
    n = len(earlier.items.get(key, b"")) // DIGEST_BYTES if earlier is not None else 0
    if earlier is not None and 0 < n <= len(value):
        head = orjson.dumps(value[:n])
        if digest(head) == earlier.values[key]:
            return n, head[:-1]
    return 0, b"["


def _raw_head(
    raw: bytes,
    body: dict[str, Any],
    key: str,
    n: int,
    start: bytes | memoryview,
    rest: bytes,
    earlier: BodyDigest | None,
) -> RawHead | None:
    """The list at ``key``'s place in ``raw``, if its bytes there are its serialisation (``start``, then ``rest``
    after a comma when both hold items, then ``]``). ``earlier``: the list was decoded after ``earlier.head``'s
    bytes, so it continues right there (one comparison); otherwise its serialisation is looked for in ``raw``.
    Either way the place is proved by decoding ``raw`` with a ``0`` there instead: that must give the body with
    ``0`` at ``key`` (a place inside another value, a look-alike, or a list that a repeated key overrides gives
    another body)."""
    if earlier is not None and earlier.head is not None:
        at = earlier.head.end + 1
        if raw[earlier.head.end : at] != b"," or not raw.startswith(rest + b"]", at):
            return None
        place, end = earlier.head.start, at + len(rest)
    else:
        text = b"".join((bytes(start), b"," if len(start) > 1 and rest else b"", rest, b"]"))
        place = raw.find(text)
        if place < 0:
            return None
        end = place + len(text) - 1
    try:
        if orjson.loads(b"".join((memoryview(raw)[:place], b"0", memoryview(raw)[end + 1 :]))) != {**body, key: 0}:
            return None
    except orjson.JSONDecodeError:
        return None
    return RawHead(key, n, place, end, digest(memoryview(raw)[:end]))


def cut_repeated(raw: bytes, head: RawHead) -> bytes | None:
    """``raw`` without the items of its list that ``head`` (the previous body's) says it repeats: the bytes before
    the list and after them, joined at the list's ``[``; None when ``raw`` does not start with the same bytes up to
    the end of those items, or adds no item right after them. The result decodes to the body minus those items
    when ``raw`` is valid JSON, and to a body with a non-empty list only if ``raw`` is (the caller checks that)."""
    end = head.end
    if len(raw) <= end + 1 or raw[end] != 0x2C or digest(memoryview(raw)[:end]) != head.digest:  # 0x2C: ","
        return None
    return b"".join((memoryview(raw)[: head.start + 1], memoryview(raw)[end + 1 :]))
