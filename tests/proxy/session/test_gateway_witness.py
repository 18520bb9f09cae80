"""Id witnesses, with the official SDKs against a live gateway: a call sent twice gets two sibling replies equal in
content, and the next call's echo of the ids the gateway minted for one of them (tool-call ids, Responses item
ids) makes that one the parent (admission cause ``echoed_ids``), so the builders train it and mark the other dead.
Where nothing the harness echoed tells them apart, the content match stands unwitnessed (``ambiguous_witness``
when the twins would train differently)."""

from __future__ import annotations

import dataclasses

import anthropic
import openai
import pytest
import sqlalchemy as sa

from db import Capture, session_scope
from polar.trajectory.prefix_merge import prefix_merge
from polar.trajectory.records import CaptureRecord

ARGS = {"path": "hello.txt", "content": "hi"}
TWICE = {"content": "I will write it.", "tool_calls": [{"name": "write_file", "arguments": ARGS}]}
SCRIPT = {"type": "scripted", "replies": [TWICE, TWICE, {"content": "Done."}]}
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}}
ECHOES = ["first", "second", "rewritten"]


def _kinds(gateway, session) -> list[tuple]:
    rows = gateway.captures(session["session_id"], full_prompt=False)
    return [(r["id"], r["parent_id"], r["admission"], r["admission_cause"]) for r in rows]


def _expect(kinds: list[tuple], echo: str) -> None:
    (a, root, *_), (b, root_b, *_), (_c, parent, admission, cause) = kinds
    assert root is None and root_b is None  # the same first call twice: two roots, siblings
    want = {"first": (a, "echoed_ids"), "second": (b, "echoed_ids"), "rewritten": (b, None)}[echo]
    assert (parent, admission, cause) == (want[0], "match", want[1])


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("echo", ECHOES)
def test_openai_chat_tool_call_ids_single_out_the_continued_retry(gateway, echo, stream):
    session = gateway.session(SCRIPT)
    client = openai.OpenAI(base_url=session["base_urls"]["openai"], api_key=session["api_key"])
    tools = [{"type": "function", "function": {"name": "write_file", "parameters": SCHEMA}}]
    messages: list = [{"role": "user", "content": "Write hello.txt"}]

    def call() -> dict:
        if not stream:
            reply = client.chat.completions.create(model="tiny", messages=messages, tools=tools)
            return reply.choices[0].message.model_dump(exclude_none=True)
        chunks = [c for c in client.chat.completions.create(model="tiny", messages=messages, tools=tools, stream=True)]
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        calls = [tc for d in deltas for tc in (d.tool_calls or []) if tc.id]
        text = "".join(d.content or "" for d in deltas)
        return {
            "role": "assistant",
            "content": text,
            "tool_calls": [{"id": tc.id, "type": "function", "function": tc.function.model_dump()} for tc in calls],
        }

    replies = [call(), call()]  # the client timed out on the first and sent the same body again
    ids = [r["tool_calls"][0]["id"] for r in replies]
    assert replies[0]["content"] == replies[1]["content"] and ids[0] != ids[1]  # equal in content, not in ids
    kept = dict(replies[0 if echo == "first" else 1])
    call_id = {"first": ids[0], "second": ids[1], "rewritten": "write_file_0"}[echo]
    kept["tool_calls"] = [{**kept["tool_calls"][0], "id": call_id}]
    messages += [kept, {"role": "tool", "tool_call_id": call_id, "content": "ok"}]
    call()
    _expect(_kinds(gateway, session), echo)


@pytest.mark.parametrize(("echo", "reloaded"), [*((e, False) for e in ECHOES), ("first", True)])
def test_anthropic_tool_use_ids_single_out_the_continued_retry(gateway, echo, reloaded):
    """``reloaded``: the process forgets the session before the next call (another replica's call, a restart):
    the siblings' minted ids come back from their records, not from a re-parse that would mint others."""
    session = gateway.session(SCRIPT)
    client = anthropic.Anthropic(base_url=session["base_urls"]["anthropic"], api_key=session["api_key"])
    tools = [{"name": "write_file", "description": "", "input_schema": SCHEMA}]
    messages: list = [{"role": "user", "content": "Write hello.txt"}]

    def call():
        return client.messages.create(model="tiny", max_tokens=256, messages=messages, tools=tools)

    replies = [call(), call()]
    uses = [next(b for b in r.content if b.type == "tool_use") for r in replies]
    assert uses[0].input == uses[1].input and uses[0].id != uses[1].id
    kept = replies[0 if echo == "first" else 1]
    use_id = {"first": uses[0].id, "second": uses[1].id, "rewritten": "toolu_rewritten"}[echo]
    content = [b.model_dump(exclude_none=True) for b in kept.content]
    content = [{**b, "id": use_id} if b["type"] == "tool_use" else b for b in content]
    messages += [
        {"role": "assistant", "content": content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use_id, "content": "ok"}]},
    ]
    if reloaded:
        gateway.gateway.histories.forget(session["session_id"])
    call()
    _expect(_kinds(gateway, session), echo)


@pytest.mark.parametrize("echo", ECHOES)
def test_responses_item_and_call_ids_single_out_the_continued_retry(gateway, echo):
    session = gateway.session(SCRIPT)
    client = openai.OpenAI(base_url=session["base_urls"]["openai"], api_key=session["api_key"])
    tools = [{"type": "function", "name": "write_file", "parameters": SCHEMA}]
    items: list = [{"role": "user", "content": "Write hello.txt"}]

    def call():
        return client.responses.create(model="tiny", input=items, tools=tools)

    replies = [call(), call()]
    kept = replies[0 if echo == "first" else 1]
    echoed = [o.model_dump(exclude_none=True) for o in kept.output]
    if echo == "rewritten":  # a harness that keeps no item ids and names calls its own way
        echoed = [{k: v for k, v in o.items() if k != "id"} for o in echoed]
        echoed = [{**o, "call_id": "own_0"} if o["type"] == "function_call" else o for o in echoed]
    call_id = next(o["call_id"] for o in echoed if o["type"] == "function_call")
    items += [*echoed, {"type": "function_call_output", "call_id": call_id, "output": "ok"}]
    call()
    _expect(_kinds(gateway, session), echo)


TEXT = {"type": "scripted", "replies": [{"content": "Hello there."}, {"content": "Hello there."}, {"content": "Bye."}]}


def test_a_text_only_responses_retry_is_singled_out_by_its_message_item_id(gateway):
    session = gateway.session(TEXT)
    client = openai.OpenAI(base_url=session["base_urls"]["openai"], api_key=session["api_key"])
    items: list = [{"role": "user", "content": "Say hello"}]
    first, _second = (
        client.responses.create(model="tiny", input=items),
        client.responses.create(model="tiny", input=items),
    )
    items += [*(o.model_dump(exclude_none=True) for o in first.output), {"role": "user", "content": "Again"}]
    client.responses.create(model="tiny", input=items)
    _expect(_kinds(gateway, session), "first")


def test_a_text_only_chat_retry_has_nothing_to_single_it_out(gateway):
    """Chat messages carry no reply id: twins equal in text are told apart by nothing, and the link stays the
    content match's (the latest), unwitnessed."""
    session = gateway.session(TEXT)
    client = openai.OpenAI(base_url=session["base_urls"]["openai"], api_key=session["api_key"])
    messages: list = [{"role": "user", "content": "Say hello"}]
    first = client.chat.completions.create(model="tiny", messages=messages).choices[0].message.content
    client.chat.completions.create(model="tiny", messages=messages)
    messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "Again"}]
    client.chat.completions.create(model="tiny", messages=messages)
    _expect(_kinds(gateway, session), "rewritten")


@pytest.mark.parametrize("echo", ["first", "rewritten"])
def test_the_builders_train_the_witnessed_twin_and_mask_an_unwitnessed_one(gateway, echo):
    """The gateway's record, built: twins that would train differently (other logprobs, as sampled replies have)
    train the one the echoed ids name and mark the other dead; without a witness both are ``ambiguous_witness``."""
    session = gateway.session(SCRIPT)
    client = openai.OpenAI(base_url=session["base_urls"]["openai"], api_key=session["api_key"])
    tools = [{"type": "function", "function": {"name": "write_file", "parameters": SCHEMA}}]
    messages: list = [{"role": "user", "content": "Write hello.txt"}]
    replies = [
        client.chat.completions.create(model="tiny", messages=messages, tools=tools).choices[0].message
        for _ in range(2)
    ]
    kept = replies[0].model_dump(exclude_none=True)
    if echo == "rewritten":
        kept["tool_calls"][0]["id"] = "write_file_0"
    messages += [kept, {"role": "tool", "tool_call_id": kept["tool_calls"][0]["id"], "content": "ok"}]
    client.chat.completions.create(model="tiny", messages=messages, tools=tools)
    with session_scope(gateway.gateway.factory) as db:
        rows = db.scalars(sa.select(Capture).where(Capture.rollout_id == session["session_id"])).all()
        records = sorted((CaptureRecord.from_row(r) for r in rows), key=lambda r: r.seq)
    # Sampled, not scripted: the second twin drew its ids with other logprobs.
    records = [dataclasses.replace(r, scripted=False) for r in records]
    a, b, c = records
    records[1] = dataclasses.replace(b, output_logprobs=tuple(x - 0.5 for x in b.output_logprobs))

    stats = prefix_merge(records).stats
    n = len(a.output_ids)
    if echo == "first":
        assert c.parent_id == a.id and stats.untrained_tokens == {"dead_branch": n}
        assert stats.loss_tokens == n + len(c.output_ids)
    else:
        assert c.parent_id == b.id and stats.untrained_tokens == {"ambiguous_witness": 2 * n}
        assert stats.loss_tokens == len(c.output_ids)
