"""Output parsers, streaming form: any split of any text adds up to the whole-text parse; text goes out early."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polar.tokens.messages import ToolCall, ToolSpec
from polar.tokens.parsers import (
    HERMES,
    QWEN3_CODER,
    MalformedToolCall,
    ParsedOutput,
    ReasoningDelta,
    TextDelta,
    ToolCallFormat,
    ToolCallParsed,
    collect,
)
from polar.tokens.parsers.types import BlockSyntaxError

FORMATS = [HERMES, QWEN3_CODER]
OPEN, CLOSE = "<tool_call>", "</tool_call>"


def oracle(fmt: ToolCallFormat, text: str, starts_in_reasoning: bool, tools: dict[str, ToolSpec]) -> tuple:
    """The documented contract, written plainly over the whole text (no incremental state)."""
    reasoning = None
    rest = text
    head = ("<think>" + text if starts_in_reasoning else text).lstrip()
    if head.startswith("<think>"):
        inside = head[len("<think>") :]
        end = inside.find("</think>")
        if end < 0:
            return "", inside.removeprefix("\n"), [], []
        reasoning = inside[:end].removeprefix("\n").removesuffix("\n")
        rest = inside[end + len("</think>") :]
        for _ in range(2):
            rest = rest.removeprefix("\n")
    # Split into stretches of text separated by parsed calls; bad blocks and stray closes are text.
    stretches, calls, malformed, current = [], [], [], ""
    while rest:
        opening, closing = rest.find(OPEN), rest.find(CLOSE)
        if opening < 0 and closing < 0:
            current, rest = current + rest, ""
        elif closing >= 0 and (opening < 0 or closing < opening):
            malformed.append(MalformedToolCall(CLOSE, "stray </tool_call> without an opening <tool_call>"))
            current, rest = current + rest[: closing + len(CLOSE)], rest[closing + len(CLOSE) :]
        else:
            current, rest = current + rest[:opening], rest[opening:]
            end = rest.find(CLOSE)
            if end < 0:
                malformed.append(MalformedToolCall(rest, "unclosed <tool_call> at end of output"))
                current, rest = current + rest, ""
                continue
            block, rest = rest[: end + len(CLOSE)], rest[end + len(CLOSE) :]
            try:
                call = fmt.parse_block(block[len(OPEN) : -len(CLOSE)], tools)
            except BlockSyntaxError as exc:
                malformed.append(MalformedToolCall(block, str(exc)))
                current += block
                continue
            calls.append((call.name, json.loads(call.arguments)))
            stretches.append(current)
            current = ""
    stretches.append(current)
    content = ""
    for i, stretch in enumerate(stretches):
        if i > 0 and stretch.isspace():
            continue
        content += stretch.removesuffix("\n") if i < len(stretches) - 1 else stretch
    return content, reasoning, calls, malformed


def streamed(fmt: ToolCallFormat, deltas: list[str], starts_in_reasoning: bool, tools: Any) -> ParsedOutput:
    parser = fmt.stream_parser(tools, starts_in_reasoning)
    events = [event for delta in deltas for event in parser.feed(delta)] + parser.finish()
    assert all(e.text for e in events if isinstance(e, TextDelta | ReasoningDelta)), "no empty deltas"
    indexes = [e.index for e in events if isinstance(e, ToolCallParsed)]
    assert indexes == list(range(len(indexes)))
    return collect(events, reasoning_opened=parser.reasoning_opened)


def comparable(parsed: ParsedOutput) -> tuple:
    calls = [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]
    return parsed.content, parsed.reasoning, calls, list(parsed.malformed)


def split(text: str, cuts: list[int]) -> list[str]:
    points = [0, *sorted(c % (len(text) + 1) for c in cuts), len(text)]
    return [text[a:b] for a, b in zip(points, points[1:], strict=False)]


# Fragments that make the interesting cases likely: tags whole and cut, newlines, bodies of both formats.
FRAGMENTS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool",
    "_call>",
    "</tool",
    "<",
    "</",
    "<th",
    "ink>",
    "\n",
    "\n",
    "\n\n",
    " ",
    "  ",
    "a",
    "Hi",
    "é漢😀",
    "{",
    '"',
    '{"name": "f", "arguments": {"x": 1}}',
    '{"name":"g"}',
    '{"name": "f", "arguments": [1]}',
    "<function=f>",
    "<function=g>",
    "<function=>",
    "<parameter=x>",
    "<parameter=y>",
    "1",
    "text <b>",
    "</parameter>",
    "</function>",
]
outputs = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=3), max_size=25).map("".join)
TOOLS = [ToolSpec("f", parameters={"properties": {"x": {"type": "string"}}}), ToolSpec("g")]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@settings(max_examples=400, deadline=None)
@given(
    output=outputs,
    cuts=st.lists(st.integers(min_value=0), max_size=12),
    starts_in_reasoning=st.booleans(),
    declare_tools=st.booleans(),
)
def test_any_split_agrees_with_the_whole_text_and_the_contract(fmt, output, cuts, starts_in_reasoning, declare_tools):
    tools = TOOLS if declare_tools else None
    whole = fmt.parse(output, tools=tools, starts_in_reasoning=starts_in_reasoning)
    expected = oracle(fmt, output, starts_in_reasoning, {t.name: t for t in tools or ()})
    assert comparable(whole) == expected
    pieces = streamed(fmt, split(output, cuts), starts_in_reasoning, tools)
    assert comparable(pieces) == expected


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@settings(max_examples=150, deadline=None)
@given(output=outputs, starts_in_reasoning=st.booleans())
def test_one_character_deltas_agree_with_the_whole_text(fmt, output, starts_in_reasoning):
    whole = fmt.parse(output, starts_in_reasoning=starts_in_reasoning)
    pieces = streamed(fmt, list(output), starts_in_reasoning, None)
    assert comparable(pieces) == comparable(whole)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_one_character_deltas_of_a_full_turn(fmt):
    block = fmt.render_tool_call(ToolCall("f", '{"x": "a\\nb <c>"}'))
    output = f"<think>\nstep 1\n</think>\n\nOK.\n{block}\n{block}"
    pieces = streamed(fmt, list(output), False, None)
    assert (pieces.content, pieces.reasoning) == ("OK.", "step 1")
    assert [json.loads(c.arguments) for c in pieces.tool_calls] == [{"x": "a\nb <c>"}] * 2


# Early emission: only what could still be a tag, or a template newline, waits.


def test_plain_text_goes_out_at_once():
    parser = HERMES.stream_parser()
    assert parser.feed("Hello wor") == [TextDelta("Hello wor")]
    assert parser.feed("ld") == [TextDelta("ld")]


def test_a_possible_tag_is_held_and_the_text_before_it_is_not():
    parser = HERMES.stream_parser()
    assert parser.feed("Hi <tool") == [TextDelta("Hi ")]
    assert parser.feed("box") == [TextDelta("<toolbox")]
    assert parser.feed(" </tool") == [TextDelta(" ")]
    assert parser.feed("_call> x") == [
        MalformedToolCall("</tool_call>", "stray </tool_call> without an opening <tool_call>"),
        TextDelta("</tool_call>"),
        TextDelta(" x"),
    ]


def test_a_block_is_emitted_when_it_closes_and_its_newline_is_dropped():
    parser = HERMES.stream_parser()
    assert parser.feed("Let me check.\n") == [TextDelta("Let me check.")]
    assert parser.feed('<tool_call>\n{"name": "ls", "arguments": {"p": "/"}}') == []
    (event,) = parser.feed("\n</tool_call>")
    assert isinstance(event, ToolCallParsed) and event.index == 0
    assert (event.call.name, json.loads(event.call.arguments)) == ("ls", {"p": "/"})
    assert parser.feed("\n") == []  # a separator, unless text follows
    assert parser.feed("Done") == [TextDelta("\nDone")]
    assert parser.finish() == []


def test_a_newline_not_followed_by_a_block_is_content():
    parser = HERMES.stream_parser()
    assert parser.feed("a\n") == [TextDelta("a")]
    assert parser.feed("b") == [TextDelta("\nb")]
    assert parser.feed("\n") == []
    assert parser.finish() == [TextDelta("\n")]


def test_reasoning_streams_and_holds_only_the_newline_before_its_close():
    parser = QWEN3_CODER.stream_parser()
    assert parser.feed("  ") == []  # may still become <think>
    assert parser.feed("<thi") == []
    assert parser.feed("nk>\nfirst") == [ReasoningDelta("first")]
    assert parser.feed("\n") == []
    assert parser.feed("second\n</thi") == [ReasoningDelta("\nsecond")]
    assert parser.feed("nk>\n") == []
    assert parser.feed("\nAnswer") == [TextDelta("Answer")]
    assert parser.reasoning_opened


def test_unclosed_block_at_finish_is_reported_and_kept_as_text():
    parser = HERMES.stream_parser()
    assert parser.feed('Hm\n<tool_call>\n{"name": "f"') == [TextDelta("Hm")]
    assert parser.finish() == [
        MalformedToolCall('<tool_call>\n{"name": "f"', "unclosed <tool_call> at end of output"),
        TextDelta('\n<tool_call>\n{"name": "f"'),
    ]


def test_feed_after_finish_is_an_error():
    parser = HERMES.stream_parser()
    parser.finish()
    with pytest.raises(ValueError, match="after finish"):
        parser.feed("x")
