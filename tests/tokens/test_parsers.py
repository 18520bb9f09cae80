"""Output parsers, whole-text form: round trips through the canonical render, real outputs, malformed text."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polar.errors import InvalidRequest, TemplateError
from polar.tokens.messages import ToolCall, ToolSpec
from polar.tokens.parsers import HERMES, QWEN3_CODER, TOOL_CALL_FORMATS, ToolCallFormat, get_format

FORMATS = [HERMES, QWEN3_CODER]
TAGS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "</parameter>")


def render_body(fmt: ToolCallFormat, content: str, reasoning: str | None, calls: list[ToolCall]) -> str:
    """The assistant body exactly as the chat template writes it (the formula the parsers invert)."""
    body = f"<think>\n{reasoning}\n</think>\n\n" if reasoning is not None else ""
    body += content
    for i, call in enumerate(calls):
        body += ("\n" if i > 0 or content != "" else "") + fmt.render_tool_call(call)
    return body


def json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return {type(None): "null", list: "array", dict: "object"}[type(value)]


def schema_for(name: str, arguments: dict[str, Any]) -> ToolSpec:
    properties = {key: {"type": json_type(value)} for key, value in arguments.items()}
    return ToolSpec(name, parameters={"type": "object", "properties": properties})


# §1 Round trip: render a message with the canonical formula, parse it back.

_pieces = st.sampled_from(["a", "Z", " ", "\n", "\t", "<", ">", "/", '"', "\\", "{", "}", "é", "漢", "😀", "="])
text = (
    st.lists(_pieces | st.text(max_size=4), max_size=12)
    .map("".join)
    .filter(lambda s: not any(tag in s for tag in TAGS))
)
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.\-]{0,15}", fullmatch=True)
keys = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
argument_objects = st.dictionaries(keys, json_values, max_size=4)
calls = st.lists(st.tuples(names, argument_objects), max_size=3, unique_by=lambda c: c[0])


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@settings(max_examples=200, deadline=None)
@given(content=text, reasoning=st.none() | text, drawn_calls=calls)
def test_render_then_parse_gives_the_message_back(fmt, content, reasoning, drawn_calls):
    tool_calls = [ToolCall(name, json.dumps(args, ensure_ascii=False)) for name, args in drawn_calls]
    tools = [schema_for(name, args) for name, args in drawn_calls]
    parsed = fmt.parse(render_body(fmt, content, reasoning, tool_calls), tools=tools)
    assert parsed.content == content
    assert parsed.reasoning == reasoning
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == drawn_calls
    assert parsed.malformed == ()
    for call in parsed.tool_calls:
        assert call.id is not None and call.id.startswith("call_") and len(call.id) == 29
        assert json.loads(call.arguments) == json.loads(json.dumps(json.loads(call.arguments)))


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_round_trip_of_unicode_nested_arguments_and_several_calls(fmt):
    arguments = [{"query": "naïve 漢字 😀", "filters": {"tags": ["a", {"b": None}], "n": 2.5}}, {}]
    tool_calls = [ToolCall("search", json.dumps(arguments[0])), ToolCall("noop", "{}")]
    for content in ("", "Searching.\n", "\n"):
        parsed = fmt.parse(render_body(fmt, content, "plan:\n1. search", tool_calls))
        assert parsed.content == content
        assert parsed.reasoning == "plan:\n1. search"
        assert [json.loads(c.arguments) for c in parsed.tool_calls] == arguments
        assert len({c.id for c in parsed.tool_calls}) == 2


def test_rendered_blocks_are_the_canonical_text():
    call = ToolCall("f", '{"s": "a\\nb", "n": 1, "o": {"k": [true]}}')
    assert HERMES.render_tool_call(call) == (
        '<tool_call>\n{"name": "f", "arguments": {"s": "a\\nb", "n": 1, "o": {"k": [true]}}}\n</tool_call>'
    )
    assert QWEN3_CODER.render_tool_call(call) == (
        "<tool_call>\n<function=f>\n<parameter=s>\na\nb\n</parameter>\n<parameter=n>\n1\n</parameter>\n"
        '<parameter=o>\n{"k": [true]}\n</parameter>\n</function>\n</tool_call>'
    )


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_render_rejects_arguments_that_are_not_an_object(fmt):
    assert fmt.render_tool_call(ToolCall("f", "")) == fmt.render_tool_call(ToolCall("f", "{}"))
    for bad in ("not json", "[1]", "null"):
        with pytest.raises(TemplateError, match="arguments must be a JSON object"):
            fmt.render_tool_call(ToolCall("f", bad))


# §2 Real outputs.


def test_hermes_compact_json_as_a_model_writes_it():
    parsed = HERMES.parse('<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call>')
    assert parsed.content == "" and parsed.reasoning is None and parsed.malformed == ()
    (call,) = parsed.tool_calls
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert call.arguments == '{"city": "Paris"}'  # re-serialised, as SGLang does


def test_content_before_a_call_loses_only_the_template_newline():
    block = '<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>'
    assert HERMES.parse("Let me check.\n" + block).content == "Let me check."
    assert HERMES.parse("Let me check.\n\n" + block).content == "Let me check.\n"
    assert HERMES.parse("Let me check." + block).content == "Let me check."
    assert HERMES.parse(block + "\n" + block + "\n").content == ""
    assert HERMES.parse(block + "\nDone.").content == "\nDone."
    assert HERMES.parse("A\n" + block + "\nB\n" + block).content == "A\nB"


def test_qwen3_coder_typed_parameters():
    output = (
        "I'll run it.\n<tool_call>\n<function=run>\n"
        "<parameter=count>\n3\n</parameter>\n"
        "<parameter=verbose>\ntrue\n</parameter>\n"
        '<parameter=options>\n{"env": {"A": "1"}, "paths": ["x"]}\n</parameter>\n'
        '<parameter=code>\nif a < b:\n    print("<b>")\n\n</parameter>\n'
        "<parameter=label>\n123\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    schema = {
        "type": "object",
        "properties": {
            "count": {"type": "integer"},
            "verbose": {"type": "boolean"},
            "options": {"type": "object"},
            "code": {"type": "string"},
            "label": {"type": "string"},
        },
    }
    parsed = QWEN3_CODER.parse(output, tools=[ToolSpec("run", parameters=schema)])
    assert parsed.content == "I'll run it." and parsed.malformed == ()
    assert json.loads(parsed.tool_calls[0].arguments) == {
        "count": 3,
        "verbose": True,
        "options": {"env": {"A": "1"}, "paths": ["x"]},
        "code": 'if a < b:\n    print("<b>")\n',
        "label": "123",
    }
    # Without a schema every value that is JSON is read as JSON; the rest stays text.
    untyped = json.loads(QWEN3_CODER.parse(output).tool_calls[0].arguments)
    assert untyped["label"] == 123 and untyped["code"] == 'if a < b:\n    print("<b>")\n'


def test_qwen3_coder_type_fallbacks():
    def value(raw: str, declared: Any) -> Any:
        block = f"<tool_call>\n<function=f>\n<parameter=p>\n{raw}\n</parameter>\n</function>\n</tool_call>"
        tools = [ToolSpec("f", parameters={"properties": {"p": {"type": declared}}})]
        return json.loads(QWEN3_CODER.parse(block, tools=tools).tool_calls[0].arguments)["p"]

    assert value("abc", "integer") == "abc"  # not JSON: the raw text
    assert value("NaN", "number") == "NaN"  # not strict JSON
    assert value("null", ["string", "null"]) is None
    assert value("12", ["string", "null"]) == "12"  # a JSON value of an undeclared type stays text
    assert value("12", ["integer", "null"]) == 12
    assert value("[1, 2]", "array") == [1, 2]


def test_reasoning_forms():
    assert HERMES.parse("<think>\nwhy\n</think>\n\nAnswer").reasoning == "why"
    assert HERMES.parse("  \n<think>why</think>Answer").content == "Answer"
    assert HERMES.parse("<think>\n\n</think>\n\n\nA").reasoning == ""
    assert HERMES.parse("<think>\n\n</think>\n\n\nA").content == "\nA"
    truncated = HERMES.parse("<think>\nstill thinking <tool_call>\n")
    assert (truncated.reasoning, truncated.content, truncated.tool_calls) == ("still thinking <tool_call>\n", "", ())
    opened = HERMES.parse("\nwhy\n</think>\n\nAnswer", starts_in_reasoning=True)
    assert (opened.reasoning, opened.content) == ("why", "Answer")
    assert HERMES.parse("no tags", starts_in_reasoning=True).reasoning == "no tags"
    assert HERMES.parse("", starts_in_reasoning=True).reasoning == ""
    assert HERMES.parse("Answer <think>x</think>").reasoning is None
    assert HERMES.parse("Answer <think>x</think>").content == "Answer <think>x</think>"


# §3 Malformed tool-call text: never raises, never a call, kept in the content, reported.

HERMES_MALFORMED = [
    ('<tool_call>\n{"name": "f", "arguments": {\n</tool_call>', "invalid JSON"),
    ('<tool_call>\n{"arguments": {"a": 1}}\n</tool_call>', 'missing "name"'),
    ('<tool_call>\n{"name": "f", "arguments": [1, 2]}\n</tool_call>', '"arguments" is a JSON array'),
    ('<tool_call>\n{"name": "", "arguments": {}}\n</tool_call>', "empty function name"),
    ('<tool_call>\n["f"]\n</tool_call>', "not an object"),
    ('<tool_call>\n{"name": "f", "arguments": {"a": NaN}}\n</tool_call>', "invalid JSON"),
    ("<tool_call>\n" + "[" * 100_000 + "\n</tool_call>", "invalid JSON"),
    ('<tool_call>\n{"name": "f", "arguments": {}}', "unclosed <tool_call>"),
    ("</tool_call>", "stray </tool_call>"),
]
QWEN3_MALFORMED = [
    ("<tool_call>\n<function=>\n</function>\n</tool_call>", "empty function name"),
    ("<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>", "no closing </parameter>"),
    ("<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</tool_call>", "missing </function>"),
    ('<tool_call>\n{"name": "f"}\n</tool_call>', "expected <function=NAME>"),
    ("<tool_call>\n<function=f>\njunk\n</function>\n</tool_call>", "unexpected text"),
    ("<tool_call>\n<function=f>\n<parameter=>\n1\n</parameter>\n</function>\n</tool_call>", "empty"),
    (
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=a>\n2\n</parameter>\n"
        "</function>\n</tool_call>",
        "given twice",
    ),
    ("<tool_call>\n<function=f x>\n</function>\n</tool_call>", "invalid <function=NAME>"),
    ("<tool_call>\n<function=f>\n<parameter=a>\n1", "unclosed <tool_call>"),
    ("</tool_call>", "stray </tool_call>"),
]


@pytest.mark.parametrize(
    ("fmt", "block", "reason"),
    [(HERMES, *case) for case in HERMES_MALFORMED] + [(QWEN3_CODER, *case) for case in QWEN3_MALFORMED],
    ids=lambda v: v.name if isinstance(v, ToolCallFormat) else None,
)
def test_malformed_block_stays_in_content_and_is_reported(fmt, block, reason):
    good = fmt.render_tool_call(ToolCall("ok", '{"x": 1}'))
    unclosed = "unclosed" in reason  # an open block swallows the rest, so it goes last
    output = "Before\n" + good + "\n" + block if unclosed else "Before\n" + block + "\n" + good + "\nAfter"
    parsed = fmt.parse(output)
    assert [c.name for c in parsed.tool_calls] == ["ok"]
    (malformed,) = parsed.malformed
    assert reason in malformed.reason
    assert malformed.text == block
    assert parsed.content == ("Before\n" + block if unclosed else "Before\n" + block + "\nAfter")


def test_unknown_function_is_malformed_only_when_tools_are_declared():
    block = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    parsed = HERMES.parse(block, tools=[ToolSpec("ls")])
    assert parsed.tool_calls == () and parsed.content == block
    assert "unknown function 'rm_rf'" in parsed.malformed[0].reason
    assert [c.name for c in HERMES.parse(block).tool_calls] == ["rm_rf"]
    qwen = "<tool_call>\n<function=rm_rf>\n</function>\n</tool_call>"
    assert QWEN3_CODER.parse(qwen, tools=[ToolSpec("ls")]).tool_calls == ()
    assert json.loads(QWEN3_CODER.parse(qwen).tool_calls[0].arguments) == {}


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@settings(max_examples=300, deadline=None)
@given(output=st.text())
def test_parse_never_raises(fmt, output):
    parsed = fmt.parse(output)
    if parsed.reasoning is None and not parsed.tool_calls:
        assert parsed.content == output


# §4 Registry.


def test_registry_and_unknown_format():
    assert set(TOOL_CALL_FORMATS) == {"hermes", "qwen3_coder"}
    assert get_format("hermes") is HERMES and get_format("qwen3_coder") is QWEN3_CODER
    with pytest.raises(InvalidRequest, match="'mistral'.*hermes, qwen3_coder") as info:
        get_format("mistral")
    assert info.value.status_code == 400
