"""Requests stored relative to the parent capture's: compact, and rebuilt exactly."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from db.request_json import compact_request, expand_chain, expand_request, is_delta

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3),
    max_leaves=6,
)
bodies = st.dictionaries(st.sampled_from(["model", "messages", "tools", "stream", "system", "x"]), values, max_size=6)


@settings(max_examples=200, deadline=None)
@given(first=bodies, edits=st.lists(st.tuples(bodies, st.lists(values, max_size=3)), max_size=4))
def test_any_chain_of_bodies_is_rebuilt_exactly(first, edits):
    chain, stored, parent = [first], [compact_request(first, None)], first
    for changes, appended in edits:
        body = {**parent, **changes}
        if isinstance(parent.get("messages"), list):
            body["messages"] = parent["messages"] + appended  # the usual case: the conversation grows
        stored.append(compact_request(body, parent))
        chain.append(body)
        parent = body
    for n in range(1, len(chain) + 1):
        assert expand_chain(stored[:n]) == chain[n - 1]


def test_a_growing_conversation_stores_only_what_is_new():
    tools = [{"name": f"tool{i}", "input_schema": {"type": "object", "description": "x" * 500}} for i in range(20)]
    parent = {"model": "m", "tools": tools, "messages": [{"role": "user", "content": "hi"}] * 30}
    child = {**parent, "messages": parent["messages"] + [{"role": "assistant", "content": "ok"}]}
    stored = compact_request(child, parent)
    assert is_delta(stored) and stored["body"] == {"messages": [{"role": "assistant", "content": "ok"}]}
    assert expand_request(stored, parent) == child


def test_a_body_that_looks_like_a_delta_is_not_misread():
    odd = {"polar_request_delta": {"same": ["a"], "kept": {}}, "body": {}}
    assert expand_chain([compact_request(odd, None)]) == odd
