"""Reuse of KV caches across requests that share a prefix (SGLang's radix cache, simplified).

In append mode each turn's prompt is the previous turn's prompt + sampled ids + new tokens, so the
previous request's KV cache covers almost all of it. Finished requests leave their cache here, keyed by
the ids it covers; a new request starts from a copy of the longest match, cropped to the shared prefix,
and prefills only the rest. Entries are evicted least-recently-used beyond a token budget. A weight
change must ``clear()`` it (cached keys and values belong to the old weights).
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
from transformers.cache_utils import Cache

from polar.tokens.render import common_prefix


class PrefixCache:
    def __init__(self, max_tokens: int = 262_144, min_match: int = 16):
        self.max_tokens = max_tokens
        self.min_match = min_match
        self._entries: OrderedDict[int, tuple[np.ndarray, Cache]] = OrderedDict()
        self._next = 0
        self.hits = 0
        self.reused_tokens = 0

    def lookup(self, ids: Sequence[int]) -> tuple[Cache | None, int]:
        """A private copy of the best cache for ``ids``, cropped to the shared prefix (never all of ``ids``:
        the last id must still be fed to get its logits), and the number of ids it covers."""
        target = np.asarray(ids, dtype=np.int64)
        best_key, best_len = None, 0
        for key, (covered, _) in self._entries.items():
            shared = min(common_prefix(covered, target), len(target) - 1)
            if shared > best_len:
                best_key, best_len = key, shared
        if best_key is None or best_len < self.min_match:
            return None, 0
        self._entries.move_to_end(best_key)
        cache = copy.deepcopy(self._entries[best_key][1])
        cache.crop(best_len - cache.get_seq_length())  # transformers 5: a negative count of tokens to drop
        self.hits += 1
        self.reused_tokens += best_len
        return cache, best_len

    def store(self, covered: Sequence[int], cache: Cache) -> None:
        """Keep ``cache``, which holds keys and values for exactly ``covered``."""
        if len(covered) < self.min_match or len(covered) > self.max_tokens:
            return
        self._entries[self._next] = (np.asarray(covered, dtype=np.int64), cache)
        self._next += 1
        while sum(len(c) for c, _ in self._entries.values()) > self.max_tokens:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()
