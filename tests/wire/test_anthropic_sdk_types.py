"""The Anthropic codec accepts every content-block type the pinned anthropic SDK defines (a newer SDK that knows
a block type the gateway would refuse fails this test), and a tool search's ``tool_reference`` result decodes."""

from __future__ import annotations

import json
import typing
from typing import Any

import anthropic.types as sdk

from polar.tokens.messages import Role
from polar.wire import anthropic as codec
from polar.wire.anthropic import CODEC


def _sdk_types(union: Any) -> set[str]:
    """The ``type`` literals of the TypedDicts in an SDK union (``ContentBlockParam``, tool-result content)."""
    out: set[str] = set()
    for member in typing.get_args(union):
        hint = typing.get_type_hints(member)["type"]
        out.update(a for a in typing.get_args(hint) if isinstance(a, str))
    return out


def _accepted(annotated: Any) -> set[str]:
    """The ``type`` literals a discriminated union of the codec's wire models accepts."""
    union = typing.get_args(annotated)[0]
    return {
        value for model in typing.get_args(union) for value in typing.get_args(model.model_fields["type"].annotation)
    }


def test_every_sdk_content_block_type_is_accepted() -> None:
    assert _sdk_types(sdk.ContentBlockParam) <= _accepted(codec._Block)


def test_every_sdk_tool_result_content_type_is_accepted() -> None:
    content = typing.get_type_hints(sdk.ToolResultBlockParam)["content"]
    (iterable,) = [a for a in typing.get_args(content) if a is not str]
    assert _sdk_types(typing.get_args(iterable)[0]) <= _accepted(codec._ResultPart)


def test_a_tool_search_result_with_tool_references_decodes() -> None:
    """Claude Code's ToolSearch answers with ``tool_reference`` blocks inside a ``tool_result`` (was a 400)."""
    body = {
        "model": "claude",
        "max_tokens": 64,
        "messages": [
            {"role": "user", "content": "find a tool"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "ToolSearch", "input": {"query": "notebook"}}
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "tool_reference", "tool_name": "NotebookEdit"}],
                    }
                ],
            },
        ],
    }
    messages = CODEC.parse_request(body).messages
    assert messages[-1].role is Role.TOOL and messages[-1].content == "[tool loaded: NotebookEdit]"
    assert messages[-1].tool_call_id == "toolu_1"
    # Declared with defer_loading (Claude Code 2.1.332 after the search): a deferred tool, shown where it loaded.
    schema = {"type": "object", "properties": {"path": {"type": "string"}}}
    body["tools"] = [{"name": "NotebookEdit", "description": "Edit a notebook", "input_schema": schema}]
    body["tools"][0]["defer_loading"] = True
    request = CODEC.parse_request(body)
    (tool,) = request.tools
    assert tool.deferred and tool.parameters == schema
    loaded = request.messages[-1].content
    assert loaded.startswith("[tool loaded: NotebookEdit]\n") and json.loads(loaded.split("\n", 1)[1]) == {
        "type": "function",
        "function": {"name": "NotebookEdit", "description": "Edit a notebook", "parameters": schema},
    }
