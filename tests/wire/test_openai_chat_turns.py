"""A turn decoded on the session's previous request: only what it adds is checked and converted, with the
same outcome as a whole decode (``OpenAIChatCodec.parse_extension``, ``json_guard.parse_json_after``)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings

from polar.errors import InvalidRequest
from polar.wire.openai_chat import CODEC
from tests.wire.junk import junk_bodies
from tests.wire.openai_chat_sdk import VALID


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(junk_bodies(VALID))
def test_a_turn_parsed_on_the_previous_one_equals_a_whole_parse(body):
    """``parse_extension`` (only the messages a turn adds are decoded) gives exactly what ``parse_request`` gives,
    or None where it cannot tell (then the whole body is parsed, which names any error)."""
    prior_body = {**VALID, "messages": VALID["messages"][:2]}
    prior = CODEC.parse_request(prior_body)
    extended = CODEC.parse_extension(body, prior_body, prior)
    if extended is None:
        return
    assert extended == CODEC.parse_request(body)


def test_a_turn_that_re_sends_the_history_is_parsed_on_it():
    prior_body = {**VALID, "messages": VALID["messages"][:2]}
    prior = CODEC.parse_request(prior_body)
    extended = CODEC.parse_extension(VALID, prior_body, prior)
    assert extended is not None and extended == CODEC.parse_request(VALID)
    assert extended.messages[:2] == prior.messages and extended.messages[0] is prior.messages[0]
    changed = {**VALID, "messages": [{"role": "system", "content": "other"}, *VALID["messages"][1:]]}
    assert CODEC.parse_extension(changed, prior_body, prior) is None
    big = {**VALID, "messages": [*VALID["messages"], {"role": "user", "content": "x", "name": None, "n": 1e19}]}
    from polar.wire.json_guard import parse_json_after

    assert (
        parse_json_after(json.dumps(big).encode(), checked=prior_body)[1] is False
    )  # a float orjson may have read from an integer literal
    bad_tail = {**VALID, "messages": [*VALID["messages"][:2], {"role": "robot", "content": "x"}]}
    assert CODEC.parse_extension(bad_tail, prior_body, prior) is None
    with pytest.raises(InvalidRequest) as caught:
        CODEC.parse_request(bad_tail)
    assert caught.value.field == "messages[2].role"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(junk_bodies(VALID))
def test_the_body_checks_skip_only_what_the_previous_body_passed(body):
    """``parse_json_after(raw, checked=previous)`` refuses exactly what a full check refuses, naming the same
    field, and accepts the same value."""
    from polar.wire.json_guard import JsonLimits, parse_json, parse_json_after

    limits = JsonLimits(max_depth=8, max_string_chars=40)
    raw = json.dumps(body).encode()
    prior = {**VALID, "messages": VALID["messages"][:2]}
    assert parse_json_after(json.dumps(prior).encode(), limits)[1]  # it passed the strict way: "checked"

    def outcome(checked):
        try:
            return parse_json_after(raw, limits, checked)[0] if checked is not None else parse_json(raw, limits)
        except InvalidRequest as exc:
            return exc.field, exc.message

    assert outcome(prior) == outcome(None)


def test_a_turn_holds_the_previous_bodys_items_in_place_of_its_equal_ones():
    """Consecutive bodies of a session share the conversation they have in common (one copy in memory)."""
    from polar.wire.json_guard import parse_json_after

    prior, _ = parse_json_after(json.dumps({**VALID, "messages": VALID["messages"][:2]}).encode())
    body, strict = parse_json_after(json.dumps(VALID).encode(), checked=prior)
    assert strict and body == VALID
    assert all(new is old for new, old in zip(body["messages"][:2], prior["messages"], strict=True))
    assert body["messages"] is not prior["messages"] and body["messages"][2] is not None


def _call(call_id: str) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "bash", "arguments": "{}"}}],
    }


def test_a_turn_checks_its_new_tool_results_against_every_earlier_call():
    """On an extension only the new messages' tool results are checked, but against every call before them: one
    answering a call of an earlier turn passes, one answering no call is refused as a whole parse refuses it."""
    from polar.wire.base import parse_after

    opening = [{"role": "user", "content": "go"}, _call("call_a"), _call("call_b")]
    prior_body = {"model": "m", "messages": [*opening, {"role": "tool", "tool_call_id": "call_b", "content": "b"}]}
    prior = parse_after(CODEC, prior_body, None)
    late = {
        **prior_body,
        "messages": [*prior_body["messages"], {"role": "tool", "tool_call_id": "call_a", "content": "a"}],
    }
    assert parse_after(CODEC, late, (prior_body, prior)) == CODEC.parse_request(late)
    orphan = {
        **prior_body,
        "messages": [*prior_body["messages"], {"role": "tool", "tool_call_id": "nope", "content": ""}],
    }
    for known in ((prior_body, prior), None):
        with pytest.raises(InvalidRequest, match="'nope' answers no earlier tool call") as caught:
            parse_after(CODEC, orphan, known)
        assert caught.value.field == "tool_call_id"
    before_its_call = {
        **prior_body,
        "messages": [*prior_body["messages"], {"role": "tool", "tool_call_id": "call_c"}, _call("call_c")],
    }
    with pytest.raises(InvalidRequest, match="'call_c' answers no earlier"):
        parse_after(CODEC, before_its_call, (prior_body, prior))
