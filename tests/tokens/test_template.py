"""Our chat template: ChatML turns, tools in the system turn, Hermes tool calls, reasoning."""

from __future__ import annotations

import json

import pytest

from polar.tokens.messages import Message, Role, ToolCall, ToolSpec, assistant, system, tool_result, user
from polar.tokens.parsers import get_format
from polar.tokens.template import GENERATION_PROMPT, ChatTemplate

WEATHER = ToolSpec("get_weather", "Weather for a city", {"type": "object", "properties": {"city": {"type": "string"}}})


def conversation() -> list[Message]:
    return [
        system("You are terse."),
        user("Weather in Paris and Rome?"),
        assistant(
            "Checking.",
            reasoning="Two cities, two calls.",
            tool_calls=(
                ToolCall("get_weather", '{"city":"Paris"}', "c1"),
                ToolCall("get_weather", '{"city": "Rome"}', "c2"),
            ),
        ),
        tool_result("21C", "c1"),
        tool_result("25C", "c2"),
        assistant("Paris 21C, Rome 25C."),
        user("Thanks"),
    ]


def test_render_exact_text():
    text = ChatTemplate().render(conversation(), [WEATHER])
    assert text.startswith("<|im_start|>system\nYou are terse.\n\n# Tools\n")
    assert json.dumps(WEATHER.as_json()) in text
    assert (
        "<|im_start|>assistant\n<think>\nTwo cities, two calls.\n</think>\n\nChecking.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n21C\n</tool_response>\n<tool_response>\n25C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nParis 21C, Rome 25C.<|im_end|>\n<|im_start|>user\nThanks<|im_end|>\n"
    ) in text
    assert text.endswith(GENERATION_PROMPT)


def test_prefixes_of_a_conversation_are_prefixes_of_its_render():
    template, messages = ChatTemplate(), conversation()
    full = template.render(messages, [WEATHER], add_generation_prompt=False)
    for k in range(1, len(messages) + 1):
        if k < len(messages) and messages[k].role is Role.TOOL and messages[k - 1].role is Role.TOOL:
            continue  # a tool group is one turn; its render is closed only after the last result
        part = template.render(messages[:k], [WEATHER], add_generation_prompt=False)
        assert full.startswith(part), k


def test_render_tail_is_the_tail_of_the_full_render():
    template, messages = ChatTemplate(), conversation()
    full = template.render(messages, [WEATHER])
    head = template.render(messages[:3], [WEATHER], add_generation_prompt=False)
    assert full == head + template.render_tail(messages[3:])


def test_tools_without_system_and_no_tools():
    template = ChatTemplate()
    assert template.render([user("hi")], [WEATHER]).startswith("<|im_start|>system\n# Tools\n")
    assert template.render([user("hi")]) == "<|im_start|>user\nhi<|im_end|>\n" + GENERATION_PROMPT


def test_trailing_assistant_is_a_prefill():
    text = ChatTemplate().render([user("hi"), assistant("Sure,")])
    assert text.endswith("<|im_start|>assistant\nSure,")


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_coder"])
def test_our_parsers_read_what_the_template_writes(fmt):
    template = ChatTemplate(tool_format=fmt)
    reply = conversation()[2]
    parsed = get_format(fmt).parse(template.assistant_body(reply), tools=[WEATHER])
    assert parsed.content == reply.content and parsed.reasoning == reply.reasoning and not parsed.malformed
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [
        (c.name, json.loads(c.arguments)) for c in reply.tool_calls
    ]


def test_hermes_block_is_what_sglang_qwen25_reads():
    """SGLang's qwen25 / vLLM's hermes detectors match '<tool_call>\\n{json}\\n</tool_call>'."""
    body = ChatTemplate().assistant_body(assistant(tool_calls=(ToolCall("f", '{"a": 1}'),)))
    assert body == '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'


def test_unknown_tool_format():
    from polar.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="nope"):
        ChatTemplate(tool_format="nope")
