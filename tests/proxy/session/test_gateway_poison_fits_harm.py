"""Poison that fits the harm, with the official openai and anthropic SDKs against a live gateway: a harness that
shortens an old tool output in place (its own text) re-roots with the cause ``tool_output_changed`` and trains on;
only content the model is claimed to have produced, and did not (its reply edited), poisons. Echoes of exactly what
was sampled match: parallel tool calls sent back in another order or split, each with the id minted for it, and an
Anthropic prefill echoed joined with its continuation."""

from __future__ import annotations

import anthropic
import openai
import pytest
import sqlalchemy as sa

from db import Capture, session_scope
from polar.trajectory.prefix_merge import prefix_merge
from polar.trajectory.records import CaptureRecord

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": SCHEMA}}]
READ = {"content": "Reading it.", "tool_calls": [{"name": "read_file", "arguments": {"path": "log.txt"}}]}
SCRIPT = {
    "type": "scripted",
    "replies": [READ, {"content": "The log has 60 lines."}, {"content": "Done."}, {"content": "Still done."}],
}
USER_NEXT = {"role": "user", "content": "Another one."}
LONG_OUTPUT = "\n".join(f"line {i}: all good" for i in range(60))


def _records(gateway, session_id: str) -> list[CaptureRecord]:
    with session_scope(gateway.gateway.factory) as db:
        rows = db.scalars(sa.select(Capture).where(Capture.rollout_id == session_id).order_by(Capture.seq)).all()
        return [CaptureRecord.from_row(r) for r in rows]


def _session(gateway, *, edit: str) -> tuple[list[CaptureRecord], list[tuple]]:
    session = gateway.session(SCRIPT)
    client = openai.OpenAI(base_url=session["base_urls"]["openai"], api_key=session["api_key"])

    def call(messages: list) -> dict:
        reply = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS)
        return reply.choices[0].message.model_dump(exclude_none=True)

    messages: list = [{"role": "user", "content": "Summarise log.txt"}]
    first = call(messages)
    (tool_call,) = first["tool_calls"]
    messages += [first, {"role": "tool", "tool_call_id": tool_call["id"], "content": LONG_OUTPUT}]
    messages += [call(messages), {"role": "user", "content": "Thanks. Anything else?"}]
    messages.append(call(messages))
    if edit == "tool_output":  # the harness prunes its context: the old tool output shortened in place
        messages[2] = {**messages[2], "content": "[output pruned: 60 lines]"}
    else:  # the model's own reply rewritten: words it never sampled
        messages[3] = {**messages[3], "content": "The log has 12 lines."}
    messages += [{"role": "user", "content": "One more time."}]
    call(messages)
    client.close()
    rows = gateway.captures(session["session_id"], full_prompt=False)
    return _records(gateway, session["session_id"]), [(r["admission"], r["admission_cause"]) for r in rows]


def test_a_tool_output_shortened_in_place_re_roots_with_its_cause_and_trains_on(gateway) -> None:
    records, kinds = _session(gateway, edit="tool_output")

    assert kinds == [("root", "first_call"), ("match", None), ("match", None), ("root", "tool_output_changed")]
    stats = prefix_merge(records).stats
    assert "poisoned" not in stats.untrained_tokens and stats.unfinished is None
    assert stats.loss_tokens == stats.sampled_tokens  # every sampled token trains (before: the last call poisoned)


def test_an_edited_reply_of_the_model_still_poisons(gateway) -> None:
    records, kinds = _session(gateway, edit="reply")

    assert kinds[-1] == ("unresolved", "history_edited")
    stats = prefix_merge(records).stats
    assert stats.untrained_tokens == {"poisoned": len(records[-1].output_ids)}
    assert stats.unfinished == "last_call_poisoned"


TWO = {
    "content": "Reading both.",
    "tool_calls": [
        {"name": "read_file", "arguments": {"path": "a.txt"}},
        {"name": "read_file", "arguments": {"path": "b.txt"}},
    ],
}


@pytest.mark.parametrize("shape", ["permuted", "split"])
def test_parallel_calls_echoed_in_another_order_with_their_minted_ids_match(gateway, shape) -> None:
    """The harness sends the reply's two parallel calls back reversed, in one message or split into two, each
    with the id the gateway minted for it: the model's reply as sampled, so the next call matches and trains."""
    session = gateway.session({"type": "scripted", "replies": [TWO, {"content": "Both read."}]})
    client = openai.OpenAI(base_url=session["base_urls"]["openai"], api_key=session["api_key"])
    messages: list = [{"role": "user", "content": "Read a.txt and b.txt"}]
    reply = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS)
    message = reply.choices[0].message.model_dump(exclude_none=True)
    first, second = message["tool_calls"]
    if shape == "permuted":
        echo = [{**message, "tool_calls": [second, first]}]
    else:
        echo = [{**message, "tool_calls": [second]}, {"role": "assistant", "content": "", "tool_calls": [first]}]
    results = [{"role": "tool", "tool_call_id": c["id"], "content": f"contents of {c['id']}"} for c in (first, second)]
    client.chat.completions.create(model="tiny", messages=[*messages, *echo, *results], tools=TOOLS)
    client.close()

    rows = gateway.captures(session["session_id"], full_prompt=False)
    assert [(r["admission"], r["admission_cause"]) for r in rows] == [("root", "first_call"), ("match", None)]
    assert rows[1]["parent_id"] == rows[0]["id"]
    stats = prefix_merge(_records(gateway, session["session_id"])).stats
    assert stats.untrained_tokens == {} and stats.exact_merges == 1


def test_an_anthropic_prefill_echoed_with_its_continuation_matches_and_trains(gateway) -> None:
    """The harness prefills the assistant turn, the model continues it, and the next request echoes the prefill
    and the continuation as one assistant message: the model's turn as its ids hold it, so the call matches."""
    session = gateway.session()
    client = anthropic.Anthropic(base_url=session["base_urls"]["anthropic"], api_key=session["api_key"])
    messages: list = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "My answer:"}]
    reply = client.messages.create(model="tiny", max_tokens=6, temperature=0, messages=messages)
    continued = "".join(block.text for block in reply.content if block.type == "text")
    messages = [messages[0], {"role": "assistant", "content": "My answer:" + continued}]
    client.messages.create(model="tiny", max_tokens=6, temperature=0, messages=[*messages, USER_NEXT])
    client.close()

    rows = gateway.captures(session["session_id"], full_prompt=False)
    assert [(r["admission"], r["admission_cause"]) for r in rows] == [("root", "first_call"), ("match", None)]
    stats = prefix_merge(_records(gateway, session["session_id"])).stats
    assert stats.untrained_tokens == {} and stats.loss_tokens == stats.sampled_tokens > 0


def test_a_prefilled_call_sent_again_is_resent(gateway) -> None:
    session = gateway.session()
    client = anthropic.Anthropic(base_url=session["base_urls"]["anthropic"], api_key=session["api_key"])
    messages: list = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "My answer:"}]
    for _ in range(2):
        client.messages.create(model="tiny", max_tokens=6, temperature=0, messages=messages)
    client.close()

    rows = gateway.captures(session["session_id"], full_prompt=False)
    assert [(r["admission"], r["admission_cause"]) for r in rows] == [("root", "first_call"), ("root", "resent")]
