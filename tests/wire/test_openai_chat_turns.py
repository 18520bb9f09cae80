"""A turn decoded on the session's previous request: only what it adds is checked and converted, with the
same outcome as a whole decode (``OpenAIChatCodec.parse_extension``, ``json_guard.parse_json_after``)."""

from __future__ import annotations

import dataclasses
import json

import orjson
import pytest
from hypothesis import HealthCheck, given, settings

from polar.digest import digest
from polar.errors import InvalidRequest
from polar.wire.body_digest import body_digest
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
    own = body_digest(body)
    if own is None:  # not an object: never decoded on a prior
        return
    extended = CODEC.parse_extension(body, own.repeats(body_digest(prior_body)), prior)
    if extended is None:
        return
    assert extended == CODEC.parse_request(body)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(junk_bodies(VALID))
def test_a_body_digested_on_the_previous_one_equals_its_own_digest(body):
    """A body digested on the previous body's digest (its leading items taken from it when they repeat) has
    exactly the digest it has alone, whatever it repeats or changes; a list's digest is its serialisation's."""
    for prior_body in ({**VALID, "messages": VALID["messages"][:2]}, VALID, {"messages": [{"role": "user"}]}):
        alone = body_digest(body)
        assert body_digest(body, body_digest(prior_body)) == alone
        if alone is not None and isinstance(body.get("messages"), list):
            assert alone.values["messages"] == digest(orjson.dumps(body["messages"]))


def test_a_turn_that_re_sends_the_history_is_parsed_on_it():
    prior_body = {**VALID, "messages": VALID["messages"][:2]}
    prior = CODEC.parse_request(prior_body)
    extended = CODEC.parse_extension(VALID, _repeats(VALID, prior_body), prior)
    assert extended is not None and extended == CODEC.parse_request(VALID)
    assert extended.messages[:2] == prior.messages and extended.messages[0] is prior.messages[0]
    changed = {**VALID, "messages": [{"role": "system", "content": "other"}, *VALID["messages"][1:]]}
    assert CODEC.parse_extension(changed, _repeats(changed, prior_body), prior) is None
    big = {**VALID, "messages": [*VALID["messages"], {"role": "user", "content": "x", "name": None, "n": 1e19}]}
    from polar.wire.json_guard import parse_json_after

    assert (
        parse_json_after(json.dumps(big).encode(), checked=body_digest(prior_body)).strict is False
    )  # a float orjson may have read from an integer literal
    bad_tail = {**VALID, "messages": [*VALID["messages"][:2], {"role": "robot", "content": "x"}]}
    assert CODEC.parse_extension(bad_tail, _repeats(bad_tail, prior_body), prior) is None
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
    passed = parse_json_after(json.dumps(prior).encode(), limits, digests=True)
    assert passed.strict and passed.digest is not None  # it passed the strict way: "checked"

    def outcome(checked):
        try:
            return parse_json_after(raw, limits, checked).value if checked is not None else parse_json(raw, limits)
        except InvalidRequest as exc:
            return exc.field, exc.message

    assert outcome(passed.digest) == outcome(None)


def test_a_turns_digest_tells_what_it_repeats_of_the_previous_body():
    """What a body repeats is known from digests alone: equal values, the leading items a list keeps, keys absent
    from both; a value serialised otherwise (keys in another order) counts as new, never as the same."""
    from polar.wire.json_guard import parse_json_after

    prior_body = {**VALID, "messages": VALID["messages"][:2]}
    parsed = parse_json_after(json.dumps(VALID).encode(), checked=body_digest(prior_body))
    assert parsed.strict and parsed.value == VALID and parsed.repeats is not None
    repeats = parsed.repeats
    assert repeats.kept("messages") == 2 and not repeats.same("messages")
    assert repeats.same("model") and repeats.same("functions")  # equal; absent from both
    reordered = {**VALID, "messages": [dict(reversed(VALID["messages"][0].items())), *VALID["messages"][1:]]}
    assert _repeats(reordered, prior_body).kept("messages") == 0
    assert not _repeats({**VALID, "tools": []}, {**VALID, "tools": None}).same("tools")
    assert not _repeats({k: v for k, v in VALID.items() if k != "model"}, VALID).same("model")
    assert _repeats(VALID, VALID).parts["messages"] == -1 and _repeats(VALID, VALID).kept("messages") == 0


def _repeats(body, prior_body):
    own, prior = body_digest(body), body_digest(prior_body)
    assert own is not None and prior is not None
    return own.repeats(prior)


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
    assert parse_after(CODEC, late, (_repeats(late, prior_body), prior)) == CODEC.parse_request(late)
    sealed = dataclasses.replace(prior, messages=tuple(m.sealed for m in prior.messages))  # as a history holds it
    assert parse_after(CODEC, late, (_repeats(late, prior_body), sealed)).messages[:4] == sealed.messages
    orphan = {
        **prior_body,
        "messages": [*prior_body["messages"], {"role": "tool", "tool_call_id": "nope", "content": ""}],
    }
    for known in ((_repeats(orphan, prior_body), prior), (_repeats(orphan, prior_body), sealed), None):
        with pytest.raises(InvalidRequest, match="'nope' answers no earlier tool call") as caught:
            parse_after(CODEC, orphan, known)
        assert caught.value.field == "tool_call_id"
    before_its_call = {
        **prior_body,
        "messages": [*prior_body["messages"], {"role": "tool", "tool_call_id": "call_c"}, _call("call_c")],
    }
    with pytest.raises(InvalidRequest, match="'call_c' answers no earlier"):
        parse_after(CODEC, before_its_call, (_repeats(before_its_call, prior_body), prior))
