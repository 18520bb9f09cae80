"""Gemini (``/v1beta/models/{model}:generateContent`` and ``:streamGenerateContent?alt=sse``): Gemini CLI, Pi.

Request -> ChatRequest. The model and streaming come from the URL (``path_model``, ``path_stream``); a body
``model`` is used only when the path names none. Keys are read in camelCase or snake_case (the REST API
accepts both); unknown keys are ignored, wrong types are an InvalidRequest naming the JSON path.
- ``systemInstruction`` (top level, else under ``config``; a Content or a string) -> a leading system
  message, its text parts joined with "\\n".
- ``contents[]``: role ``model`` -> assistant (missing role -> user). In a model turn, text parts are
  concatenated as they are (a streamed reply comes back as many fragments of one text), ``thought: true``
  parts the same way into the reasoning, and each ``functionCall {id?, name, args}`` is a ToolCall.
  In a user turn, each ``functionResponse {id?, name, response}`` is a tool message, in order, then one
  user message with the text parts joined with "\\n". A tool message's content is ``response.output``
  when the response is exactly ``{"output": "<string>"}`` (Gemini CLI's shape: the text the tool printed),
  otherwise ``json.dumps(response)``.
- ``inlineData`` / ``fileData`` parts become a placeholder text (``[image omitted: ...]``): the model reads
  text only, and a 400 would end the agent's loop when a tool returns an image. ``thoughtSignature`` is
  ignored, and parts that carry no data we read (a lone signature, ``executableCode``) are skipped.
- ``tools[].functionDeclarations[]`` -> ToolSpecs, with ``parametersJsonSchema`` as the schema, else
  ``parameters`` (Gemini's OpenAPI subset) with its upper-case type names (``"OBJECT"``) lower-cased into
  JSON schema's; other Gemini schema keys (``nullable``, ``propertyOrdering``) are kept as they are.
  Google's own tools (``googleSearch``, ``codeExecution``) run on Google's side and are skipped.
- ``generationConfig`` (top level, else the same keys under ``config``): ``maxOutputTokens`` ->
  max_tokens; ``temperature``, ``topP``, ``topK``, ``stopSequences`` (as ``stop``), ``seed`` -> sampling;
  ``candidateCount`` other than 1 is rejected. ``thinkingConfig``, ``responseMimeType``/``responseJsonSchema``,
  ``safetySettings``, ``cachedContent``, ``toolConfig`` and ``labels`` are ignored: the codec translates,
  the gateway decides how to answer a JSON-mode call (Gemini CLI's router).

Completion -> GenerateContentResponse: one candidate whose parts are the reasoning (``thought: true``),
the text and one ``functionCall`` per call; ``finishReason`` STOP (tool calls and stop strings included),
MAX_TOKENS, or OTHER for an aborted generation. ``candidatesTokenCount`` counts every generated token,
reasoning included (the split is not known here, so there is no ``thoughtsTokenCount``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from polar.errors import InvalidRequest, Overloaded, PolarError
from polar.tokens.messages import Message, Role, ToolCall, ToolSpec
from polar.wire._wire import media_placeholder, not_none, parse_body
from polar.wire.base import StreamMeta
from polar.wire.canonical import ChatRequest, Completion
from polar.wire.gemini_output import GeminiStream, error_body, finish_chunk, function_call
from polar.wire.tool_schema import TYPES, check_schema

INT32_MAX = 2**31 - 1


class _Wire(BaseModel):
    model_config = ConfigDict(
        extra="ignore", strict=True, alias_generator=to_camel, validate_by_alias=True, validate_by_name=True
    )


class _FunctionCall(_Wire):
    id: str | None = None
    name: str
    args: dict[str, Any] | None = None


class _FunctionResponse(_Wire):
    id: str | None = None
    name: str
    response: dict[str, Any] | None = None


class _Media(_Wire):
    """``inlineData`` / ``fileData``: only the MIME type matters, for the placeholder's wording."""

    mime_type: str = ""

    @property
    def placeholder(self) -> str:
        major = self.mime_type.split("/")[0]
        return media_placeholder(major if major in ("image", "audio", "video") else "file")


class _Part(_Wire):
    text: str | None = None
    thought: bool | None = None
    function_call: _FunctionCall | None = None
    function_response: _FunctionResponse | None = None
    inline_data: _Media | None = None
    file_data: _Media | None = None

    @model_validator(mode="before")
    @classmethod
    def _not_empty(cls, data: Any) -> Any:
        # Gemini refuses a part with no field at all ("required oneof field 'data' must have one initialized
        # field"); a part with fields we do not read (a lone thoughtSignature, executableCode) is skipped.
        if isinstance(data, dict) and not data:
            raise ValueError("a part needs a field (text, functionCall, functionResponse, inlineData, ...)")
        return data


class _Content(_Wire):
    role: Literal["user", "model"] | None = None
    parts: list[_Part]


class _SystemInstruction(_Wire):
    """A Content whose role, if any, is ignored (Gemini CLI sends "user"; others send none)."""

    parts: list[_Part]


class _FunctionDeclaration(_Wire):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    parameters_json_schema: dict[str, Any] | None = None


class _Tool(_Wire):
    function_declarations: list[_FunctionDeclaration] | None = None


class _ThinkingConfig(_Wire):
    """Ignored (the model thinks as its template says), but held to the documented range: -1 (dynamic) or more."""

    thinking_budget: int | None = Field(default=None, ge=-1, le=INT32_MAX)


class _GenerationConfig(_Wire):
    # Ranges are Google's documented ones (docs/limits.md); topK is an int32 there.
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: float | None = Field(default=None, ge=1, le=INT32_MAX)  # the SDKs send 64.0; still a whole number
    stop_sequences: list[str] | None = None
    seed: int | None = None
    candidate_count: int | None = None
    thinking_config: _ThinkingConfig | None = None


class _Config(_GenerationConfig):
    """The SDK-style ``config`` object: generation keys flat, plus the system instruction and tools."""

    system_instruction: str | _SystemInstruction | None = None
    tools: list[_Tool] | None = None


class _Request(_Wire):
    contents: list[_Content] = Field(min_length=1)
    system_instruction: str | _SystemInstruction | None = None
    tools: list[_Tool] | None = None
    generation_config: _GenerationConfig | None = None
    config: _Config | None = None
    model: str | None = None


# --- request ---------------------------------------------------------------------------------------------


def _data_of(part: _Part, path: str) -> str | None:
    """Which data field the part holds (None: none we read); InvalidRequest when it holds several."""
    held = [
        name
        for name in ("text", "function_call", "function_response", "inline_data", "file_data")
        if getattr(part, name) is not None
    ]
    if len(held) > 1:
        names = " and ".join(to_camel(name) for name in held)
        raise InvalidRequest(f"{path}: a part holds one kind of data, not {names}", field=path)
    return held[0] if held else None


def _misplaced(kind: str, path: str, where: str) -> InvalidRequest:
    return InvalidRequest(f"{path}.{to_camel(kind)}: not allowed in {where}", field=f"{path}.{to_camel(kind)}")


def _system_text(system: str | _SystemInstruction, path: str) -> str:
    if isinstance(system, str):
        return system
    texts = []
    for j, part in enumerate(system.parts):
        kind = _data_of(part, f"{path}.parts[{j}]")
        if kind == "text":
            texts.append(part.text or "")
        elif kind is not None:
            raise _misplaced(kind, f"{path}.parts[{j}]", "a system instruction")
    return "\n".join(texts)


def _tool_output(response: dict[str, Any] | None) -> str:
    """The text a tool message carries: Gemini CLI's ``{"output": text}`` unwrapped, anything else as JSON."""
    response = response or {}
    if list(response) == ["output"] and isinstance(response["output"], str):
        return response["output"]
    return json.dumps(response, ensure_ascii=False)


def _model_turn(content: _Content, path: str) -> Message:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    for j, part in enumerate(content.parts):
        kind = _data_of(part, f"{path}.parts[{j}]")
        if kind == "text":
            (thoughts if part.thought else texts).append(part.text or "")
        elif kind == "function_call" and part.function_call is not None:
            call = part.function_call
            calls.append(ToolCall(call.name, json.dumps(call.args or {}, ensure_ascii=False), id=call.id))
        elif kind in ("inline_data", "file_data"):
            texts.append(getattr(part, kind).placeholder)
        elif kind is not None:
            raise _misplaced(kind, f"{path}.parts[{j}]", "a model turn")
    reasoning = "".join(thoughts) if thoughts else None
    return Message(Role.ASSISTANT, "".join(texts), reasoning=reasoning, tool_calls=tuple(calls))


def _user_turn(content: _Content, path: str) -> list[Message]:
    results: list[Message] = []
    texts: list[str] = []
    for j, part in enumerate(content.parts):
        kind = _data_of(part, f"{path}.parts[{j}]")
        if kind == "text":
            texts.append(part.text or "")
        elif kind == "function_response" and part.function_response is not None:
            result = part.function_response
            results.append(Message(Role.TOOL, _tool_output(result.response), tool_call_id=result.id, name=result.name))
        elif kind in ("inline_data", "file_data"):
            texts.append(getattr(part, kind).placeholder)
        elif kind is not None:
            raise _misplaced(kind, f"{path}.parts[{j}]", "a user turn")
    # Results answer the previous model turn, so they come first; an all-results turn adds no user message.
    return results + ([Message(Role.USER, "\n".join(texts))] if texts or not results else [])


def json_schema(schema: Any) -> Any:
    """A Gemini ``Schema`` as JSON schema: type names lower-cased, in nested properties/items/anyOf too."""
    if isinstance(schema, list):
        return [json_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    converted: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str):
            converted[key] = value.lower()
        elif key == "properties" and isinstance(value, dict):
            converted[key] = {name: json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "anyOf"):
            converted[key] = json_schema(value)
        else:
            converted[key] = value
    return converted


GEMINI_TYPES = TYPES | {"type_unspecified"}  # Gemini's OpenAPI ``Type`` enum, lower-cased (``json_schema``)


def _tools(tools: list[_Tool], path: str) -> tuple[ToolSpec, ...]:
    specs = []
    for i, tool in enumerate(tools):
        for k, declaration in enumerate(tool.function_declarations or []):
            where = f"{path}[{i}].functionDeclarations[{k}]"
            if declaration.parameters_json_schema is not None:
                schema = declaration.parameters_json_schema
                check_schema(schema, f"{where}.parametersJsonSchema")
            else:
                schema = json_schema(declaration.parameters or {})
                check_schema(schema, f"{where}.parameters", GEMINI_TYPES)
            specs.append(ToolSpec(declaration.name, declaration.description or "", schema))
    return tuple(specs)


def _sampling(config: _GenerationConfig, path: str) -> dict[str, Any]:
    if config.candidate_count not in (None, 1):
        field = f"{path}.candidateCount"
        raise InvalidRequest(f"{field}: only one candidate can be generated", field=field)
    top_k = config.top_k
    if top_k is not None and not float(top_k).is_integer():
        raise InvalidRequest(f"{path}.topK: must be a whole number", field=f"{path}.topK")
    return not_none(
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=None if top_k is None else int(top_k),
        stop=config.stop_sequences,
        seed=config.seed,
    )


def _translate(request: _Request, path_model: str | None, path_stream: bool | None) -> ChatRequest:
    model = (path_model or request.model or "").removeprefix("models/")
    if not model:
        raise InvalidRequest("model: the URL names no model", field="model")
    config = request.config
    messages: list[Message] = []
    system, system_path = request.system_instruction, "systemInstruction"
    if system is None and config is not None:
        system, system_path = config.system_instruction, "config.systemInstruction"
    if system is not None and (text := _system_text(system, system_path)):
        messages.append(Message(Role.SYSTEM, text))
    for i, content in enumerate(request.contents):
        path = f"contents[{i}]"
        if content.role == "model":
            messages.append(_model_turn(content, path))
        else:
            messages.extend(_user_turn(content, path))
    tools, tools_path = request.tools, "tools"
    if tools is None and config is not None:
        tools, tools_path = config.tools, "config.tools"
    generation, generation_path = request.generation_config, "generationConfig"
    if generation is None:
        generation, generation_path = config, "config"
    return ChatRequest(
        model=model,
        messages=tuple(messages),
        tools=_tools(tools or [], tools_path),
        max_tokens=generation.max_output_tokens if generation else None,
        sampling=_sampling(generation, generation_path) if generation else {},
        stream=bool(path_stream),
    )


class GeminiCodec:
    """The ``gemini`` protocol codec (see the module docstring for the mapping)."""

    name = "gemini"
    messages_field = "contents"
    key_in_query = True
    count_tokens_defaults: Mapping[str, Any] = MappingProxyType({})

    def count_tools(self, body: Any) -> int:
        """The ``functionDeclarations`` of the top-level ``tools`` (camelCase or snake_case)."""
        tools = body.get("tools") if isinstance(body, dict) else None
        if not isinstance(tools, list):
            return 0
        n = 0
        for tool in tools:
            if isinstance(tool, dict):
                declared = tool.get("functionDeclarations", tool.get("function_declarations"))
                n += len(declared) if isinstance(declared, list) else 0
        return n

    def count_messages(self, body: Any) -> int:
        """``contents`` (objects): each is at least one message (a user turn of results only, one per result)."""
        contents = body.get("contents") if isinstance(body, dict) else None
        return sum(1 for c in contents if isinstance(c, dict)) if isinstance(contents, list) else 0

    def parse_request(
        self, body: Any, *, path_model: str | None = None, path_stream: bool | None = None
    ) -> ChatRequest:
        return _translate(parse_body(_Request, body), path_model, path_stream)

    def response(self, completion: Completion, *, request: ChatRequest | None = None) -> dict[str, Any]:
        parts: list[dict[str, Any]] = []
        if completion.reasoning:
            parts.append({"text": completion.reasoning, "thought": True})
        if completion.content:
            parts.append({"text": completion.content})
        parts += [function_call(call) for call in completion.tool_calls]
        return finish_chunk(completion, parts, completion.id)

    def stream_encoder(self, meta: StreamMeta, *, request: ChatRequest | None = None) -> GeminiStream:
        return GeminiStream(meta)

    def error_response(self, error: PolarError) -> tuple[int, dict[str, Any]]:
        if isinstance(error, Overloaded):  # Google answers overload with 503 UNAVAILABLE
            return 503, {"error": {"code": 503, "message": error.message, "status": "UNAVAILABLE"}}
        return error.status_code, error_body(error)


CODEC = GeminiCodec()
