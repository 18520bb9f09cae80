"""Request-body validation shared by the Anthropic and Gemini codecs: pydantic errors as JSON paths.

``parse_body(model, body)`` validates a decoded JSON body and turns pydantic's first complaint into an
``InvalidRequest`` whose ``field`` is the JSON path the caller wrote (``messages[1].content[0].type``).

Pydantic's error locations also name union members (``str``, ``list[...]``) and discriminator tags
(``tool_result``), which are not keys of the body. The path is therefore rebuilt by walking the body along
the location and keeping only the steps that exist in it, so it is right whatever shape the unions take.

``media_placeholder`` is the text both codecs put where a client sent media the model cannot read;
``not_none`` and ``arguments_object`` are the small conversions they share.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_snake
from pydantic_core import ErrorDetails

from polar.errors import InvalidRequest
from polar.tokens.messages import ToolCall

ModelT = TypeVar("ModelT", bound=BaseModel)


def media_placeholder(kind: str) -> str:
    """What a text-only model reads in place of an image, a document or other media it cannot see.

    A placeholder rather than a 400 keeps an agent's loop alive when a tool returns a screenshot or a PDF;
    the wording matches the OpenAI codecs' image placeholder.
    """
    if kind == "image":
        return "[image omitted: this model cannot see images]"
    return f"[{kind} omitted: this model reads text only]"


def not_none(**values: Any) -> dict[str, Any]:
    """The values the caller set: ``sampling`` holds only parameters the request named."""
    return {name: value for name, value in values.items() if value is not None}


def arguments_object(call: ToolCall) -> dict[str, Any]:
    """A call's arguments as the JSON object both wires require (the output parsers only emit objects)."""
    parsed = call.parsed_arguments()
    return parsed if isinstance(parsed, dict) else {}


def parse_body(model: type[ModelT], body: object) -> ModelT:
    """Validate a decoded JSON body against ``model``; InvalidRequest naming the JSON path otherwise."""
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object", field="body")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        path, message = _first_problem(exc.errors(), body)
        raise InvalidRequest(f"{path}: {message}", field=path) from None


def _first_problem(errors: list[ErrorDetails], body: dict[str, Any]) -> tuple[str, str]:
    """The path and message to report: the deepest error under the first offending top-level key.

    A value that fits no member of a union gets one error per member; the deepest one says what is wrong
    inside the member the caller meant (a list of blocks with a bad block, rather than "not a string").
    Errors that land on the same path (a value of the wrong type for every member) are reported together.
    """
    top = errors[0]["loc"][:1]
    candidates = [(json_path(e, body), _message(e)) for e in errors if e["loc"][:1] == top]
    depth = max(path.count(".") + path.count("[") for path, _ in candidates)
    deepest = [(p, m) for p, m in candidates if p.count(".") + p.count("[") == depth]
    path = deepest[0][0]
    messages = list(dict.fromkeys(m for p, m in deepest if p == path))
    return path, " or ".join(messages)


def _message(error: ErrorDetails) -> str:
    """Pydantic's message, in JSON's words where it would name one of our private model classes."""
    if error["type"] in ("model_type", "model_attributes_type", "dict_type"):
        return "Input should be a JSON object"
    return error["msg"]


def json_path(error: ErrorDetails, body: object) -> str:
    """The error's location as a JSON path into ``body``, without pydantic's union-member steps."""
    loc = error["loc"]
    parts: list[str] = []
    node: Any = body
    for position, step in enumerate(loc):
        last = position == len(loc) - 1
        if isinstance(step, int) and isinstance(node, list) and 0 <= step < len(node):
            parts.append(f"[{step}]")
            node = node[step]
        elif isinstance(step, str) and isinstance(node, dict) and step == node.get("type") and not last:
            continue  # a discriminator tag names the block's type, it is not a key
        elif isinstance(step, str) and isinstance(node, dict) and (key := _key_in(node, step)) is not None:
            parts.append(f".{key}")
            node = node[key]
        elif last and error["type"] == "missing" and isinstance(step, str):
            parts.append(f".{step}")  # a required key the caller left out
    if error["type"] in ("union_tag_invalid", "union_tag_not_found"):
        parts.append("." + str(error.get("ctx", {}).get("discriminator", "type")).strip("'"))
    return "".join(parts).lstrip(".") or "body"


def _key_in(node: dict[str, Any], step: str) -> str | None:
    """``step`` as the caller spelled it: itself, or its snake_case form (Gemini accepts both spellings)."""
    if step in node:
        return step
    snake = to_snake(step)
    return snake if snake in node else None
