"""Which parts of a session's request repeat its previous one, known without keeping the previous one's text.

An agent re-sends its whole conversation on every turn, and the gateway checks and decodes only what a request
adds. It used to find that out by comparing with the session's previous body, kept whole: the conversation's
text, held as Python strings (one to four bytes a character), outweighed the session's token ids. A session now
keeps a ``BodyDigest`` per remembered body instead: a 128-bit digest of each top-level value and of each item of
a list value (the messages), about 16 bytes a message.

- A digest is of the value's serialisation by orjson (``polar.digest``), so equal digests mean equal JSON values.
- Equal values serialised differently (the keys of an object in another order) get other digests: they count as
  new, which costs work, never a wrong answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from polar.digest import DIGEST_BYTES, digest, digest_joined


@dataclass(frozen=True)
class BodyDigest:
    """A decoded JSON object's digests: ``values`` per top-level key (of the value's serialisation, a list's as
    well); ``items`` per list-valued key, its items' digests concatenated (``DIGEST_BYTES`` each)."""

    values: dict[str, bytes]
    items: dict[str, bytes]

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


def body_digest(body: Any, earlier: BodyDigest | None = None) -> BodyDigest | None:
    """``body``'s digests; None when it is no JSON object or cannot be serialised (nested past orjson's limit).

    ``earlier``: the digest of a body this one likely extends (the session's previous request). A list that starts
    with all of that body's list (an agent's conversation, re-sent) is then serialised once for its leading items
    and once for the rest, and only the new items are digested one by one: the leading items' digests are the
    earlier list's. Otherwise each item is digested."""
    if not isinstance(body, dict):
        return None
    values: dict[str, bytes] = {}
    items: dict[str, bytes] = {}
    try:
        for key, value in body.items():
            if isinstance(value, list):
                kept, head = _kept(value, key, earlier)
                texts = [orjson.dumps(item) for item in value[kept:]]
                items[key] = (earlier.items[key] if earlier and kept else b"") + b"".join([digest(t) for t in texts])
                values[key] = digest_joined(head, b"," if kept and texts else b"", b",".join(texts), b"]")
            else:
                values[key] = digest(orjson.dumps(value))
    except (orjson.JSONEncodeError, TypeError):
        return None
    return BodyDigest(values, items)


def _kept(value: list[Any], key: str, earlier: BodyDigest | None) -> tuple[int, bytes]:
    """How many leading items of ``value`` are all of ``earlier``'s list at ``key`` (0 when they are not), and the
    start of ``value``'s serialisation before the rest: ``[`` and those items' text."""
    n = len(earlier.items.get(key, b"")) // DIGEST_BYTES if earlier is not None else 0
    if earlier is not None and 0 < n <= len(value):
        head = orjson.dumps(value[:n])
        if digest(head) == earlier.values[key]:
            return n, head[:-1]
    return 0, b"["
