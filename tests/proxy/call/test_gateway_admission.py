"""Every call is admitted as ``root``, ``match`` or ``unresolved``, stored on its capture; every root after the
first says why. The model's own reply edited is unresolved (poison); the client's own text changed around the
model's replies (a user turn, a dropped message) is a root with its cause, never a silent child."""

from __future__ import annotations

import asyncio

from polar.backends.local import LocalBackend
from tests.proxy.asgi_gateway import asgi_gateway, captures, open_session
from tests.proxy.gateway_server import settings_for

SCRIPT = {"type": "scripted", "replies": [{"content": f"reply number {i}"} for i in range(12)]}
TOOL = {"type": "function", "function": {"name": "ls", "description": "list", "parameters": {"type": "object"}}}
GREP = {"type": "function", "function": {"name": "grep", "description": "search", "parameters": {"type": "object"}}}


def _run(tmp_path, cache_dir, engine, scenario, policy: dict = SCRIPT) -> list[dict]:
    async def main() -> list[dict]:
        settings = settings_for(tmp_path, cache_dir, session_cache_ttl_s=60)
        async with asgi_gateway(settings, LocalBackend(engine)) as (_gw, client):
            session = await open_session(client, policy=policy)
            headers = {"Authorization": f"Bearer {session['api_key']}"}

            async def call(messages: list, tools: list | None = None) -> str:
                body: dict = {"model": "tiny", "messages": messages}
                if tools:
                    body["tools"] = tools
                reply = await client.post("/v1/chat/completions", json=body, headers=headers)
                assert reply.status_code == 200, reply.text
                return reply.json()["choices"][0]["message"]["content"]

            await scenario(call)
            return await captures(client, session["session_id"])

    return asyncio.run(main())


def _kinds(rows: list[dict]) -> list[tuple[str, str | None]]:
    return [(r["admission"], r["admission_cause"]) for r in rows]


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


def _assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def test_a_chain_is_one_root_then_matches(tmp_path, cache_dir, engine):
    async def scenario(call):
        messages = [_user("go")]
        for turn in range(3):
            messages += [_assistant(await call(messages)), _user(f"more {turn}")]

    rows = _run(tmp_path, cache_dir, engine, scenario)
    assert _kinds(rows) == [("root", "first_call"), ("match", None), ("match", None)]


def test_an_edited_user_turn_before_a_reply_is_a_root_saying_so(tmp_path, cache_dir, engine):
    """The client's own text changed, not the model's: the call re-roots with the cause and trains on."""

    async def scenario(call):
        a1 = await call([_user("go")])
        a2 = await call([_user("go"), _assistant(a1), _user("second")])
        # The second user message is edited; the model's second reply, sampled after the original, is kept.
        await call([_user("go"), _assistant(a1), _user("second, edited"), _assistant(a2), _user("third")])

    rows = _run(tmp_path, cache_dir, engine, scenario)
    assert _kinds(rows)[-1] == ("root", "user_turn_changed")


def test_an_edited_own_reply_is_unresolved(tmp_path, cache_dir, engine):
    async def scenario(call):
        a1 = await call([_user("go")])
        a2 = await call([_user("go"), _assistant(a1), _user("second")])
        await call([_user("go"), _assistant(a1 + " (edited)"), _user("second"), _assistant(a2), _user("third")])

    rows = _run(tmp_path, cache_dir, engine, scenario)
    assert _kinds(rows)[-1] == ("unresolved", "history_edited")
    assert rows[-1]["parent_id"] is None


def test_a_tool_added_mid_session_is_a_root_saying_so(tmp_path, cache_dir, engine):
    async def scenario(call):
        a1 = await call([_user("go")], [TOOL])
        await call([_user("go"), _assistant(a1), _user("next")], [TOOL, GREP])

    rows = _run(tmp_path, cache_dir, engine, scenario)
    assert _kinds(rows) == [("root", "first_call"), ("root", "tools_changed")]
    # Why the second call was rendered whole rather than on its parent's ids is stored with it.
    assert [r["fallback_reason"] for r in rows] == [None, "no earlier call is extended by this request"]
    assert [r["render_mode"] for r in rows] == ["canonical", "canonical"]


def test_changed_reasoning_is_a_root_saying_so(tmp_path, cache_dir, engine):
    async def scenario(call):
        a1 = await call([_user("go")])
        other = {"role": "assistant", "content": a1, "reasoning_content": "a thought the model never had"}
        await call([_user("go"), other, _user("next")])

    rows = _run(tmp_path, cache_dir, engine, scenario)
    assert _kinds(rows) == [("root", "first_call"), ("root", "reasoning_changed")]


def test_a_rebuilt_history_and_a_new_conversation_are_roots_with_causes(tmp_path, cache_dir, engine):
    def system(turn: int) -> dict:
        return {"role": "system", "content": f"repository map, version {turn}"}

    async def scenario(call):
        a1 = await call([system(1), _user("go")])
        # aider-style: every turn the history is rebuilt under a new header, the model's replies echoed as sampled.
        a2 = await call([system(2), _user("go"), _assistant(a1), _user("second")])
        await call([system(3), _user("go"), _assistant(a1), _user("second"), _assistant(a2), _user("third")])
        await call([_user("something else entirely")])

    rows = _run(tmp_path, cache_dir, engine, scenario)
    assert _kinds(rows) == [
        ("root", "first_call"),
        ("root", "history_rebuilt"),
        ("root", "history_rebuilt"),
        ("root", "new_conversation"),
    ]


def test_a_deleted_message_between_replies_is_a_root_saying_so(tmp_path, cache_dir, engine):
    async def scenario(call):
        a1 = await call([_user("go")])
        a2 = await call([_user("go"), _assistant(a1), _user("second")])
        await call([_user("go"), _assistant(a1), _assistant(a2), _user("third")])

    rows = _run(tmp_path, cache_dir, engine, scenario)
    assert _kinds(rows)[-1] == ("root", "messages_dropped")


def test_a_dropped_middle_exchange_and_a_system_prompt_of_another_agent_name_their_causes(tmp_path, cache_dir, engine):
    """Causes read right: a dropped middle exchange is not ``reasoning_changed``; a sub-agent's system prompt
    is compared with every agent's, not only the one with the longest conversation."""

    def system(text: str) -> dict:
        return {"role": "system", "content": text}

    async def scenario(call):
        a1 = await call([system("main"), _user("go")])
        a2 = await call([system("main"), _user("go"), _assistant(a1), _user("second")])
        a3 = await call([system("main"), _user("go"), _assistant(a1), _user("second"), _assistant(a2), _user("3")])
        await call([system("main"), _user("go"), _assistant(a1), _user("3"), _assistant(a3), _user("4")])
        await call([system("helper"), _user("a side task")])
        await call([system("main"), _user("a new task")])

    rows = _run(tmp_path, cache_dir, engine, scenario)
    assert _kinds(rows)[3:] == [("root", "messages_dropped"), ("root", "system_changed"), ("root", "new_conversation")]


def test_roots_among_many_side_calls_still_name_a_sub_agent_and_a_summary(tmp_path, cache_dir, engine):
    """A root's cause is read from every earlier call (their tool-call arguments, their replies), however many side
    calls (titles, command checks) the session made before it."""
    brief = "Find every TODO in the parser module and list them"
    task = {
        "type": "function",
        "function": {"name": "task", "description": "delegate", "parameters": {"type": "object"}},
    }
    policy = {
        "type": "scripted",
        "replies": [
            {"content": "delegating", "tool_calls": [{"name": "task", "arguments": {"prompt": brief}}]},
            {"content": "The parser has three TODO markers left."},
        ],
        "tool_free_reply": "Side answer",
    }

    async def scenario(call):
        await call([_user("clean up the parser")], [task])
        for i in range(40):
            await call([_user(f"a title for conversation {i}")])
        await call([_user(brief)], [task])  # the sub-agent, briefed with the tool call's argument
        await call([_user("So far: The parser has three TODO markers left. Go on.")])  # a summary of its reply

    rows = _run(tmp_path, cache_dir, engine, scenario, policy)
    assert len(rows) == 43 and all(r["admission"] == "root" for r in rows)
    assert [r["admission_cause"] for r in rows[-2:]] == ["sub_agent", "summarised"]
