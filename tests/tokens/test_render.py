"""Append-mode prompts against canonical renders."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polar.settings import RenderMode
from polar.tokens.messages import Message, Role, ToolCall, ToolSpec, assistant, system, tool_result, user
from polar.tokens.render import PriorCall, PromptBuilder
from polar.tokens.template import ChatTemplate

TOOLS = (ToolSpec("bash", "Run a command", {"type": "object", "properties": {"cmd": {"type": "string"}}}),)


@pytest.fixture(params=["small", "qwen"])
def builder(request) -> PromptBuilder:
    return PromptBuilder(request.getfixturevalue(f"{request.param}_tokenizer"), ChatTemplate())


def sample_canonically(builder: PromptBuilder, reply: Message) -> tuple[int, ...]:
    """What a model whose sampled ids are the canonical encoding of ``reply`` would return."""
    return tuple(builder.tokenizer.encode(builder.template.assistant_body(reply))) + (builder.tokenizer.im_end_id,)


def call(messages, reply, builder, tools=TOOLS) -> PriorCall:
    prompt = builder.build(messages, tools)
    return PriorCall(tuple(messages), tuple(tools), reply, prompt.ids, sample_canonically(builder, reply))


def bash(cmd: str, call_id: str = "call_1") -> ToolCall:
    return ToolCall("bash", json.dumps({"cmd": cmd}, separators=(",", ":")), call_id)


def test_append_equals_canonical_over_many_turns(builder):
    messages = [system("You are an agent."), user("List files, then count them.")]
    prior: list[PriorCall] = []
    for turn in range(6):
        reply = assistant(f"Step {turn}.", tool_calls=(bash(f"ls -la /tmp/{turn}"),))
        if prior:
            prompt = builder.build(messages, TOOLS, prior)
            assert prompt.mode is RenderMode.APPEND and prompt.parent is prior[-1]
            assert prompt.ids == builder.canonical_ids(messages, TOOLS)
            assert prompt.prefix_len == prior[-1].sequence_length
        prior.append(call(messages, reply, builder))
        # The harness echoes the reply its own way: new ids, re-serialised arguments.
        echoed = Message(
            Role.ASSISTANT,
            reply.content,
            tool_calls=(ToolCall("bash", json.dumps({"cmd": f"ls -la /tmp/{turn}"}), f"x{turn}"),),
        )
        messages += [echoed, tool_result(f"{turn} files", f"x{turn}")]


def test_drift_keeps_the_sampled_ids(qwen_tokenizer):
    """The model sampled ' hel'+'lo' (reference §C.5 case 1); canonical re-encoding would say ' hello'."""
    builder = PromptBuilder(qwen_tokenizer)
    messages = [user("Say hello")]
    first = builder.build(messages)
    sampled = tuple(qwen_tokenizer.encode("Well,")) + (11338, 385) + (qwen_tokenizer.im_end_id,)
    reply = assistant("Well, hello")
    assert qwen_tokenizer.decode(sampled[:-1]) == reply.content
    prior = PriorCall(tuple(messages), (), reply, first.ids, sampled)
    follow = messages + [assistant("Well, hello"), user("again")]
    appended = builder.build(follow, (), [prior])
    canonical = builder.canonical_ids(follow)
    assert list(appended.ids[: prior.sequence_length]) == [*first.ids, *sampled]
    assert appended.ids != canonical
    assert qwen_tokenizer.decode(appended.ids) == qwen_tokenizer.decode(canonical)
    # Canonical mode still finds the parent and measures how much of the sample survived.
    drifted = builder.build(follow, (), [prior], mode=RenderMode.CANONICAL)
    assert drifted.ids == canonical and drifted.parent is prior
    assert len(first.ids) < drifted.prefix_len < prior.sequence_length


def test_truncated_reply_gets_an_end_of_turn(small_tokenizer):
    builder = PromptBuilder(small_tokenizer)
    messages = [user("Write a lot")]
    first = builder.build(messages)
    sampled = tuple(small_tokenizer.encode("aaaa bbbb"))  # cut by max_new_tokens: no <|im_end|>
    prior = PriorCall(tuple(messages), (), assistant("aaaa bbbb"), first.ids, sampled)
    follow = messages + [assistant("aaaa bbbb"), user("go on")]
    prompt = builder.build(follow, (), [prior])
    assert prompt.ids[prior.sequence_length] == small_tokenizer.im_end_id
    assert prompt.ids == builder.canonical_ids(follow)


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda m: [m[0], user("A different question")] + m[2:], id="history-edited"),
        pytest.param(lambda m: m[:2] + [assistant("I did something else.")] + m[3:], id="reply-not-echoed"),
        pytest.param(
            lambda m: m[:2] + [assistant("Ok.", tool_calls=(bash("rm -rf /"),))] + m[3:], id="arguments-changed"
        ),
        pytest.param(lambda m: m[:3], id="nothing-new"),
    ],
)
def test_anything_else_falls_back_to_canonical(small_tokenizer, edit):
    builder = PromptBuilder(small_tokenizer)
    messages = [system("s"), user("q")]
    reply = assistant("Ok.", tool_calls=(bash("ls"),))
    prior = call(messages, reply, builder)
    follow = edit(messages + [reply, tool_result("a b c", "call_1")])
    prompt = builder.build(follow, TOOLS, [prior])
    assert prompt.mode is RenderMode.CANONICAL and prompt.parent is None and prompt.prefix_len == 0
    assert prompt.fallback_reason and prompt.ids == builder.canonical_ids(follow, TOOLS)


def test_changed_tools_fall_back(small_tokenizer):
    builder = PromptBuilder(small_tokenizer)
    messages = [user("q")]
    reply = assistant("a")
    prior = call(messages, reply, builder)
    more_tools = TOOLS + (ToolSpec("edit", "Edit a file", {"type": "object"}),)
    assert builder.build(messages + [reply, user("r")], more_tools, [prior]).mode is RenderMode.CANONICAL


def test_a_deferred_tool_loaded_mid_conversation_still_appends(small_tokenizer):
    """A tool search loads a deferred tool: the next request declares it, but it is not listed up front (its
    definition is in the search's result), so the prompt so far is unchanged and the call extends the last."""
    builder = PromptBuilder(small_tokenizer)
    search = assistant("Loading.", tool_calls=(ToolCall("ToolSearch", '{"query":"select:cron"}', "call_1"),))
    messages = [user("q")]
    prior = call(messages, search, builder)
    cron = ToolSpec("cron", "List cron jobs", {"type": "object"}, deferred=True)
    follow = messages + [search, tool_result("[tool loaded: cron]", "call_1")]
    prompt = builder.build(follow, TOOLS + (cron,), [prior])
    assert prompt.mode is RenderMode.APPEND and prompt.parent is prior
    assert prompt.ids == builder.canonical_ids(follow, TOOLS) == builder.canonical_ids(follow, TOOLS + (cron,))
    assert "List cron jobs" not in small_tokenizer.decode(list(prompt.ids))


@pytest.mark.parametrize(
    "echo",
    [
        pytest.param(lambda r: [Message(Role.ASSISTANT, " Ok. \n", tool_calls=r.tool_calls)], id="whitespace"),
        pytest.param(lambda r: [Message(Role.ASSISTANT, r.content, tool_calls=r.tool_calls)], id="reasoning-dropped"),
        pytest.param(
            lambda r: [assistant(r.content, reasoning=r.reasoning), assistant(tool_calls=r.tool_calls)],
            id="split-in-two",
        ),
        pytest.param(
            lambda r: [
                Message(
                    Role.ASSISTANT,
                    r.content,
                    reasoning=r.reasoning,
                    tool_calls=(ToolCall("bash", '{ "cmd" : "ls" }', "gemini_ts_0"),),
                )
            ],
            id="ids-and-json-rewritten",
        ),
    ],
)
def test_real_cli_echoes_still_append(small_tokenizer, echo):
    builder = PromptBuilder(small_tokenizer)
    messages = [system("s"), user("q")]
    reply = assistant("Ok.", reasoning="Let me list.", tool_calls=(bash("ls"),))
    prior = call(messages, reply, builder)
    follow = messages + echo(reply) + [tool_result("a b c", "call_1")]
    prompt = builder.build(follow, TOOLS, [prior])
    assert prompt.mode is RenderMode.APPEND and prompt.parent is prior
    canonical_equivalent = messages + [reply, tool_result("a b c", "call_1")]
    assert prompt.ids == builder.canonical_ids(canonical_equivalent, TOOLS)


def test_deepest_parent_wins_and_branches_are_found(small_tokenizer):
    builder = PromptBuilder(small_tokenizer)
    m1 = [user("q1")]
    r1 = assistant("a1")
    c1 = call(m1, r1, builder, tools=())
    m2 = m1 + [r1, user("q2")]
    r2 = assistant("a2")
    c2 = call(m2, r2, builder, tools=())
    deeper = builder.build(m2 + [r2, user("q3")], (), [c1, c2])
    assert deeper.parent is c2
    branch = builder.build(m1 + [r1, user("a different q2")], (), [c1, c2])
    assert branch.parent is c1 and branch.mode is RenderMode.APPEND


# A generated conversation: turns of (assistant reply, then tool results or a user message).
reply_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
replies = st.builds(
    lambda text, reasoning, cmds: assistant(
        text, reasoning=reasoning or None, tool_calls=tuple(bash(c, f"id{i}") for i, c in enumerate(cmds))
    ),
    reply_text,
    st.one_of(st.none(), reply_text),
    st.lists(reply_text, max_size=2),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=st.lists(replies, min_size=1, max_size=5), with_tools=st.booleans())
def test_property_append_equals_canonical_when_sampling_is_canonical(small_tokenizer, turns, with_tools):
    builder = PromptBuilder(small_tokenizer)
    tools = TOOLS if with_tools else ()
    messages: list[Message] = [system("sys"), user("start")]
    prior: list[PriorCall] = []
    for reply in turns:
        prompt = builder.build(messages, tools, prior)
        assert prompt.ids == builder.canonical_ids(messages, tools)
        if prior:
            assert prompt.mode is RenderMode.APPEND
        prior.append(PriorCall(tuple(messages), tools, reply, prompt.ids, sample_canonically(builder, reply)))
        follow = [tool_result(f"out {i}", c.id) for i, c in enumerate(reply.tool_calls)] or [user("next")]
        messages = messages + [reply] + follow
