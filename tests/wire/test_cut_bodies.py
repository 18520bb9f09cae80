"""A turn decoded on the bytes of the session's previous request (``RawHead``, ``cut_repeated``): only what follows
the previous body's messages is decoded, with the same outcome as a whole decode, or the body is decoded whole."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polar.errors import InvalidRequest
from polar.wire.base import parse_after, parse_extended
from polar.wire.body_digest import cut_repeated
from polar.wire.json_guard import JsonLimits, ParsedBody, parse_json_after
from polar.wire.openai_chat import CODEC
from tests.wire.junk import junk_bodies
from tests.wire.openai_chat_sdk import VALID

PRIOR_BODY = {**VALID, "messages": VALID["messages"][:2]}
STYLES = {
    "orjson": orjson.dumps,  # as JSON.stringify and httpx write it
    "python": lambda body: json.dumps(body).encode(),  # spaces after separators: never cut
    "ascii": lambda body: json.dumps(body, separators=(",", ":")).encode(),  # \\u escapes: cut only if ASCII
}


def _prior() -> ParsedBody:
    parsed = parse_json_after(orjson.dumps(PRIOR_BODY), digests=True, key="messages")
    assert parsed.digest is not None and parsed.digest.head is not None
    return parsed


def _outcome(raw: bytes, checked: Any) -> ParsedBody | str:
    try:
        return parse_json_after(raw, checked=checked, digests=True, key="messages")
    except InvalidRequest as exc:
        return f"{exc.field}: {exc.message}"


@st.composite
def turns(draw: st.DrawFn) -> Any:
    """Junk bodies; most of them keep the previous body's messages in front, as a turn does."""
    body = draw(junk_bodies(VALID))
    if isinstance(body, dict) and isinstance(body.get("messages"), list) and draw(st.booleans()):
        body["messages"] = [*PRIOR_BODY["messages"], *body["messages"][2:]]
    return body


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns(), st.sampled_from(sorted(STYLES)))
def test_a_body_cut_on_the_previous_ones_bytes_decodes_as_it_does_whole(body, style):
    """Cut or not, a body decodes to the same value (the cut messages being the previous body's), the same
    digests, the same request, or the same error naming the same field."""
    try:
        raw = STYLES[style](body)
    except (TypeError, ValueError):  # what a style cannot write
        return
    prior = _prior()
    cut, whole = _outcome(raw, prior.digest), _outcome(raw, None)
    if isinstance(whole, str) or isinstance(cut, str):
        # The same refusal; a body checked on the previous one may skip the messages that passed before.
        assert cut == whole or cut == _outcome(raw, _uncut(prior))
        return
    if whole.digest is None:  # no JSON object: nothing to cut, nothing to digest
        assert cut.digest is None and cut.cut is None and cut.value == whole.value
        return
    assert cut.digest is not None
    assert (cut.digest.values, cut.digest.items, cut.digest.head) == (
        whole.digest.values,
        whole.digest.items,
        whole.digest.head,
    )
    if cut.cut is None:
        assert cut.value == whole.value
        return
    assert style == "orjson" or raw.isascii()
    assert {**cut.value, "messages": [*PRIOR_BODY["messages"], *cut.value["messages"]]} == whole.value
    assert cut.cut.whole() == whole.value
    prior_request = CODEC.parse_request(PRIOR_BODY)
    assert cut.repeats is not None
    expected = _request(lambda: parse_after(CODEC, whole.value, None))
    request = _request(lambda: parse_extended(CODEC, cut.value, cut.repeats, prior_request, cut.cut.count))
    assert request is None or request == expected


def _request(parse: Any) -> Any:
    try:
        return parse()
    except InvalidRequest as exc:
        return exc.message


def _uncut(prior: ParsedBody) -> Any:
    assert prior.digest is not None
    return dataclasses.replace(prior.digest, head=None)


def test_a_turn_written_as_orjson_writes_it_is_cut_and_keeps_its_place():
    prior = _prior()
    body = {**VALID, "messages": [*PRIOR_BODY["messages"], *VALID["messages"][2:]]}
    parsed = parse_json_after(orjson.dumps(body), checked=prior.digest, digests=True, key="messages")
    assert parsed.cut is not None and parsed.cut.count == 2
    assert parsed.value["messages"] == VALID["messages"][2:]
    assert parsed.digest is not None and parsed.digest.head is not None and parsed.digest.head.items == 4
    # And the next turn is cut on this one's place.
    after = {**body, "messages": [*body["messages"], {"role": "user", "content": "next"}]}
    again = parse_json_after(orjson.dumps(after), checked=parsed.digest, digests=True, key="messages")
    assert again.cut is not None and again.cut.count == 4 and again.value["messages"] == [after["messages"][-1]]


@pytest.mark.parametrize(
    "tail, why",
    [
        (b',"messages":[{"role":"user","content":"x"}]}', "a repeated key overrides the messages"),
        (b',"metadata":{"messages":[1]}}', "another value holds a look-alike"),
    ],
)
def test_a_cut_list_that_is_not_the_bodys_own_is_decoded_whole(tail, why):
    prior = _prior()
    body = {**VALID, "messages": [*PRIOR_BODY["messages"], *VALID["messages"][2:]]}
    raw = orjson.dumps(body)[:-1] + tail
    parsed = parse_json_after(raw, checked=prior.digest, digests=True, key="messages")
    if parsed.cut is not None:
        parsed_whole = {**parsed.value, "messages": [*PRIOR_BODY["messages"], *parsed.value["messages"]]}
    else:
        parsed_whole = parsed.value
    assert parsed_whole == orjson.loads(raw), why


def test_a_trailing_comma_after_the_previous_messages_is_refused_as_a_whole_decode_refuses_it():
    prior = _prior()
    assert prior.digest is not None and prior.digest.head is not None
    raw = orjson.dumps(PRIOR_BODY)
    end = prior.digest.head.end
    broken = raw[:end] + b",]" + raw[end + 1 :]
    with pytest.raises(InvalidRequest) as cut:
        parse_json_after(broken, checked=prior.digest, digests=True, key="messages")
    with pytest.raises(InvalidRequest) as whole:
        parse_json_after(broken, digests=True, key="messages")
    assert cut.value.message == whole.value.message


def test_a_bad_new_message_is_named_by_its_index_in_the_whole_list():
    prior = _prior()
    body = {**VALID, "messages": [*PRIOR_BODY["messages"], {"role": "user", "content": "x" * 20}]}
    raw = orjson.dumps(body)
    assert prior.digest is not None and prior.digest.head is not None
    assert cut_repeated(raw, prior.digest.head) is not None
    with pytest.raises(InvalidRequest) as refused:
        parse_json_after(raw, JsonLimits(max_string_chars=15), checked=prior.digest, digests=True, key="messages")
    assert refused.value.field == "messages.2.content"
