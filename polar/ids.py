"""Ids that name a call or a tool call in a reply: unique, not secret."""

from __future__ import annotations

import random


def random_hex(n_bytes: int) -> str:
    """``2 * n_bytes`` random hex digits from the process's Mersenne Twister (seeded from the OS, and again in a
    forked child). Not ``os.urandom`` (``uuid4``, ``secrets``): that system call lets go of the interpreter lock,
    and the event loop then waited for busy worker threads to hand it back (stalls of 60 ms at 1,000 streams)."""
    return f"{random.getrandbits(8 * n_bytes):0{2 * n_bytes}x}"
