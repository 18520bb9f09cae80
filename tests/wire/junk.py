"""Junk request bodies for the codecs' fuzz tests: a valid body with values replaced or deleted, or pure JSON."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def _containers(node: Any, path: tuple = ()):
    if isinstance(node, dict | list):
        yield path
        for key, child in node.items() if isinstance(node, dict) else enumerate(node):
            yield from _containers(child, (*path, key))


@st.composite
def junk_bodies(draw: st.DrawFn, valid: dict[str, Any], max_edits: int = 3) -> Any:
    """``valid`` with one to ``max_edits`` values (at any depth) replaced by random JSON or deleted; or pure JSON."""
    if draw(st.booleans()) and draw(st.booleans()):
        return draw(JSON)
    body = copy.deepcopy(valid)
    for _ in range(draw(st.integers(1, max_edits))):
        path = draw(st.sampled_from(list(_containers(body))))
        node = body
        for key in path:
            node = node[key]
        if not node:
            continue
        key = draw(st.sampled_from(list(node) if isinstance(node, dict) else list(range(len(node)))))
        if draw(st.booleans()):
            del node[key]
        else:
            node[key] = draw(JSON)
    return body
