"""128-bit digests that stand for text a process compares but need not keep (a session's earlier requests).

xxh3-128 under a seed drawn once per process: digests never leave the process, so equal digests mean equal data
and a collision cannot be aimed at from outside.
"""

from __future__ import annotations

import secrets

import xxhash

SEED = secrets.randbits(64)
DIGEST_BYTES = 16


def digest(data: bytes | memoryview) -> bytes:
    """The digest of ``data`` (``DIGEST_BYTES`` long)."""
    return xxhash.xxh3_128_digest(data, seed=SEED)


def digest_joined(*parts: bytes | memoryview) -> bytes:
    """``digest(b"".join(parts))``, without joining them."""
    h = xxhash.xxh3_128(seed=SEED)
    for part in parts:
        h.update(part)
    return h.digest()


def digest_parts(*parts: str) -> bytes:
    """One digest of several texts, each length-prefixed (``("ab", "c")`` and ``("a", "bc")`` differ)."""
    h = xxhash.xxh3_128(seed=SEED)
    for part in parts:
        data = part.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.digest()
