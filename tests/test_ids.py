"""Call and tool-call ids: the hex digits asked for, and no repeats (a harness keys its tool results by them)."""

from __future__ import annotations

import string

from polar.ids import random_hex


def test_random_hex_gives_the_digits_asked_for_and_does_not_repeat():
    ids = [random_hex(12) for _ in range(10_000)]
    assert all(len(i) == 24 and set(i) <= set(string.hexdigits.lower()) for i in ids)
    assert len(set(ids)) == len(ids)
    assert len(random_hex(1)) == 2  # leading zeros kept
