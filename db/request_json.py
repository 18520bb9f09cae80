"""How a capture stores the raw request: relative to its parent's, so storage grows with what is new.

Harnesses re-send the whole conversation (and their tool list, often 20-80 KB) on every call, so storing each
body whole grows with turns x context. A child capture stores instead

    {"polar_request_delta": {"same": [keys equal to the parent's], "kept": {list key: items kept}},
     "body": {every other key; for a kept list key only the items after the parent's}}

and the full body is rebuilt along the parent chain (``expand_chain``, ``full_request_json``). A root, or a
body that shares nothing with its parent's, is stored as it came.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from sqlalchemy.orm import Session

from db.capture_tree import chain_to_root
from db.models import Capture

DELTA = "polar_request_delta"


def is_delta(stored: Any) -> bool:
    return isinstance(stored, dict) and DELTA in stored and set(stored) == {DELTA, "body"}


def compact_request(body: Any, parent_body: Any) -> Any:
    """What to store for ``body`` whose parent capture's full request was ``parent_body`` (None for a root)."""
    if is_delta(body) or not isinstance(body, dict) or not isinstance(parent_body, dict):
        return compact_known(body, [], {})
    same: list[str] = []
    kept: dict[str, int] = {}
    for key, value in body.items():
        old = parent_body.get(key)
        if key in parent_body and old == value:
            same.append(key)
        elif isinstance(value, list) and isinstance(old, list) and 0 < len(old) <= len(value):
            if value[: len(old)] == old:
                kept[key] = len(old)
    return compact_known(body, same, kept)


def compact_known(
    body: Any, same: Collection[str], kept: Mapping[str, int], cut: Mapping[str, int] | None = None
) -> Any:
    """What to store for ``body``, given what it repeats of its parent's request: the keys whose values are the
    same (``same``) and the list keys whose first ``kept[key]`` items are (the caller knows, from the bodies or
    from their digests). ``cut``: list keys whose first ``cut[key]`` items ``body`` holds no longer (all of them
    repeated: ``cut[key] == kept[key]``)."""
    if is_delta(body):  # a body that happens to look like our format is wrapped, never misread
        return {DELTA: {"same": [], "kept": {}}, "body": body}
    if not isinstance(body, dict) or not (same or kept):
        return body
    gone = cut or {}
    rest = {
        key: value[kept[key] - gone.get(key, 0) :] if key in kept else value
        for key, value in body.items()
        if key not in same
    }
    return {DELTA: {"same": list(same), "kept": dict(kept)}, "body": rest}


def expand_request(stored: Any, parent_body: Any) -> Any:
    """The full request from what was stored and the parent's full request."""
    if not is_delta(stored):
        return stored
    delta, body = stored[DELTA], stored["body"]
    full = {key: parent_body[key] for key in delta["same"]}
    for key, value in body.items():
        full[key] = parent_body[key][: delta["kept"][key]] + value if key in delta["kept"] else value
    return full


def expand_chain(stored_root_first: Iterable[Any]) -> Any:
    """The full request of the last capture of a root-first chain of stored requests."""
    full: Any = None
    for stored in stored_root_first:
        full = expand_request(stored, full)
    return full


def full_request_json(session: Session, capture: Capture) -> Any:
    """``capture``'s request as the harness sent it (one query for the chain)."""
    return expand_chain(c.request_json for c in reversed(chain_to_root(session, capture)))
