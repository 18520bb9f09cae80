"""A session's history holds its calls' messages sealed (a digest, a role and ids; no text) and its latest bodies
as digests (``Message.sealed``, ``polar.wire.body_digest``): an agent's turn is still matched, stored relative to
its parent and rebuilt exactly, and a request whose build would render a sealed message is decoded whole again."""

from __future__ import annotations

import asyncio

import pytest

from polar.backends.local import LocalBackend
from polar.proxy.call.intake import Intake
from polar.tokens.messages import Message, Role, ToolCall
from polar.tokens.render import PromptBuilder, SealedText
from tests.proxy.asgi_gateway import asgi_gateway, captures, open_session
from tests.proxy.gateway_server import settings_for

SCRIPT = {"type": "scripted", "replies": [{"content": f"reply {i} é"} for i in range(8)]}


def test_a_sealed_message_keeps_what_matching_compares_and_no_text(small_tokenizer):
    from polar.tokens.matching import same_message

    call = ToolCall("bash", '{"cmd": "ls", "n": 1.0}', "call_1")
    full = Message(Role.ASSISTANT, "  look  ", "think", (call,))
    sealed = full.sealed
    assert sealed is full.sealed and sealed.sealed is sealed  # one object: shared by identity
    assert sealed.content == "" and sealed.reasoning is None and sealed.tool_calls[0].arguments == ""
    assert sealed.tool_calls[0].id == "call_1" and sealed.role is Role.ASSISTANT
    echoed = Message(Role.ASSISTANT, "look", "think", (ToolCall("bash", '{"n":1,"cmd":"ls"}', "other_id"),))
    assert same_message(echoed, sealed) and same_message(sealed, echoed) and same_message(echoed.sealed, sealed)
    for changed in (
        Message(Role.ASSISTANT, "looked", "think", (call,)),
        Message(Role.ASSISTANT, "look", "thought", (call,)),
        Message(Role.ASSISTANT, "look", "think", (ToolCall("bash", '{"cmd": "ls", "n": 2}'),)),
        Message(Role.USER, "look", "think", (call,)),
        Message(Role.ASSISTANT, "look", "think", ()),
    ):
        assert not same_message(changed, sealed) and same_message(changed, changed.sealed)
    with pytest.raises(SealedText):  # nothing renders a sealed message
        PromptBuilder(small_tokenizer).canonical_ids([Message(Role.USER, "hi"), sealed])


def test_a_sessions_history_keeps_no_text_and_its_captures_rebuild_exactly(tmp_path, cache_dir, engine):
    asyncio.run(_history_without_text(settings_for(tmp_path, cache_dir), engine))


async def _history_without_text(settings, engine) -> None:
    async with asgi_gateway(settings, LocalBackend(engine)) as (gw, client):
        session = await open_session(client, policy=SCRIPT)
        headers = {"Authorization": f"Bearer {session['api_key']}"}
        messages: list = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go ü"}]
        sent = []
        for turn in range(5):
            body = {"model": "tiny", "messages": list(messages), "temperature": 0.5}
            reply = await client.post("/v1/chat/completions", json=body, headers=headers)
            assert reply.status_code == 200, reply.text
            sent.append(body)
            content = reply.json()["choices"][0]["message"]["content"]
            messages += [{"role": "assistant", "content": content}, {"role": "user", "content": f"next {turn} ✓"}]
        history = gw.histories.cached(session["session_id"])
        assert history is not None and len(history.nodes) == 5
        for node in history.nodes.values():
            assert all(m.digest is not None and m.content == "" for m in node.messages)
        last = gw.histories.last_request(session["session_id"])
        assert last is not None and all(m.digest is not None for m in last.request.messages)
        assert history.digests and not hasattr(history, "bodies")
        stored = await captures(client, session["session_id"], requests=True)
        assert [c["request"] for c in stored] == sent  # stored relative to the parent; rebuilt exactly
        assert [c["parent_id"] for c in stored[1:]] == [c["id"] for c in stored[:-1]]


def test_a_request_extending_a_refused_one_is_decoded_whole_and_extends_the_last_call(
    tmp_path, cache_dir, engine, monkeypatch
):
    """The refused request was remembered (sealed) for the next decode, but no call was made of it: the next
    request, decoded on top of it, holds as sealed the echo of the last call's reply, which matching must read.
    The gateway decodes it whole and plans it again: it extends the last call, with the ids a session that never
    saw the refused request gives it."""
    whole: list[int] = []
    decode_whole = Intake.decode_whole

    async def counted(self, *args):
        whole.append(1)
        return await decode_whole(self, *args)

    monkeypatch.setattr(Intake, "decode_whole", counted)
    asyncio.run(_after_a_refusal(settings_for(tmp_path, cache_dir), engine))
    assert whole == [1]  # the refused session's third request, and nothing else


async def _after_a_refusal(settings, engine) -> None:
    async with asgi_gateway(settings, LocalBackend(engine)) as (gw, client):
        opening = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]

        async def call(headers: dict, messages: list, **extra: object) -> dict:
            body = {"model": "tiny", "messages": messages, **extra}
            reply = await client.post("/v1/chat/completions", json=body, headers=headers)
            return {"status": reply.status_code, **reply.json()}

        outcomes = []
        for refuse_first in (True, False):
            session = await open_session(client, policy=SCRIPT, models=["tiny"])
            headers = {"Authorization": f"Bearer {session['api_key']}"}
            first = await call(headers, opening)
            echo = {"role": "assistant", "content": first["choices"][0]["message"]["content"]}
            second = [*opening, echo, {"role": "user", "content": "again"}]
            if refuse_first:
                refused = await call(headers, second, model="other")  # refused when planned, after its decode
                assert refused["status"] == 404 and refused["error"]["param"] == "model"
            third = await call(headers, [*second, {"role": "user", "content": "and more"}])
            assert third["status"] == 200, third
            stored = await captures(client, session["session_id"])
            outcomes.append(stored)
        refused_session, clean_session = outcomes
        assert [c["status"] for c in refused_session] == ["OK", "OK"]
        assert refused_session[1]["parent_id"] == refused_session[0]["id"]
        keys = ("prefix_len", "n_prompt", "prompt_delta_ids", "admission")
        assert {k: refused_session[1][k] for k in keys} == {k: clean_session[1][k] for k in keys}
