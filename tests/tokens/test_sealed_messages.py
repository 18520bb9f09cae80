"""A sealed message (``Message.sealed``: what a session's history keeps of a message) matches exactly what the
message itself matches: ``same_message`` by key agrees with ``same_message`` on the texts, for messages that differ
in whitespace, reasoning, tool-call ids, argument spelling (key order, spacing, ``1.0`` for ``1``) or meaning."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from polar.tokens.matching import same_message
from polar.tokens.messages import Message, Role, ToolCall

# JSON values without booleans (Python compares True equal to 1; a key tells them apart, as the model does).
_scalars = st.one_of(
    st.integers(-5, 5),
    st.sampled_from([0.0, -0.0, 1.0, 2.5, -3.0]),
    st.text("ab é", max_size=3),
    st.none(),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from("xyz"), inner, max_size=3)),
    max_leaves=6,
)


@st.composite
def _arguments(draw) -> str:
    """Arguments as a harness may write them: any key order and spacing, or text that is not JSON."""
    if draw(st.booleans()):
        return draw(st.sampled_from(["", "{", "not json", "{'a': 1}"]))
    value = draw(st.dictionaries(st.sampled_from("abc"), _values, max_size=3))
    if draw(st.booleans()):
        value = dict(reversed(list(value.items())))
    return json.dumps(value, separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])))


@st.composite
def _messages(draw) -> Message:
    calls = tuple(
        ToolCall(draw(st.sampled_from(["bash", "edit"])), draw(_arguments()), draw(st.sampled_from([None, "c1", "c2"])))
        for _ in range(draw(st.integers(0, 2)))
    )
    return Message(
        draw(st.sampled_from([Role.ASSISTANT, Role.USER, Role.TOOL])),
        draw(st.sampled_from(["", "ok", " ok\n", "OK", "ok é"])),
        draw(st.sampled_from([None, "", "why", " why "])),
        calls,
        draw(st.sampled_from([None, "c1"])),
    )


@settings(max_examples=500, deadline=None)
@given(_messages(), _messages())
def test_a_sealed_message_matches_what_its_message_matches(a: Message, b: Message) -> None:
    same = same_message(a, b)
    assert same_message(a, b.sealed) is same
    assert same_message(a.sealed, b) is same
    assert same_message(a.sealed, b.sealed) is same
    assert same_message(a, a.sealed) and a.sealed.sealed is a.sealed


def test_a_sealed_message_keeps_no_text_and_its_ids() -> None:
    message = Message(
        Role.TOOL, "x" * 10_000, "r" * 1000, (ToolCall("bash", '{"cmd": "' + "y" * 5000 + '"}', "c9"),), "c9"
    )
    sealed = message.sealed
    assert (sealed.content, sealed.reasoning, sealed.tool_calls[0].arguments) == ("", None, "")
    assert (sealed.role, sealed.tool_call_id, sealed.tool_calls[0].id, sealed.tool_calls[0].name) == (
        Role.TOOL,
        "c9",
        "c9",
        "bash",
    )
    assert sealed.digest == message.key and len(sealed.digest) == 16
