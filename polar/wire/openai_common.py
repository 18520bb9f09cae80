"""What the OpenAI Chat and Responses codecs share: strict wire models, JSON-path errors, content parts,
sampling fields, the error body and ids.

Wire models are strict (a string is never coerced to a number, a bool is not an int) and ignore unknown
fields, because harnesses send many provider options the gateway has no use for. A body that does not
validate raises ``InvalidRequest`` whose ``field`` is the JSON path of the first problem
(``messages[2].content``, ``input[0].output[1].text``), so a harness author can find it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError

from polar.errors import ContextLengthExceeded, InvalidRequest, PolarError
from polar.wire.json_guard import NotJsonText, parse_json_text

# Images cannot be shown to a text-only model. A placeholder (rather than a 400) keeps an agent loop alive
# when a harness tool returns a screenshot (Codex's view_image): the model reads that it cannot see it, and
# the capture records exactly what the model was given.
IMAGE_PLACEHOLDER = "[image omitted: this model cannot see images]"

# Part types whose ``text`` is the text; other names for the same thing across Chat and Responses.
TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})
IMAGE_PART_TYPES = frozenset({"image_url", "input_image", "image"})

M = TypeVar("M", bound=BaseModel)


class WireModel(BaseModel):
    """Base of every request-side wire model: strict types, unknown fields ignored."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class ContentPart(WireModel):
    """One part of an array-form content: ``{"type": "text", "text": ...}`` and its Responses cousins."""

    type: str
    text: str | None = None
    refusal: str | None = None


class SamplingWire(WireModel):
    """Sampling fields both OpenAI APIs accept; ``top_k``/``min_p``/``seed`` are the usual extensions.

    ``temperature`` and ``top_p`` are held to OpenAI's documented ranges (0-2, 0-1: docs/limits.md); the
    extensions' ranges are checked once, by the backend's ``SamplingParams``, which names the field too.
    """

    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None

    def sampling(self, stop: str | Sequence[str] | None = None) -> dict[str, Any]:
        """The SGLang-named parameters the caller set (None means "not set" and is left out)."""
        chosen: dict[str, Any] = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "seed": self.seed,
        }
        out = {name: value for name, value in chosen.items() if value is not None}
        if stop is not None:
            stops = (stop,) if isinstance(stop, str) else tuple(stop)
            if stops:
                out["stop"] = stops
        return out


# A reasoning effort: OpenAI's documented values across its models (``none`` and ``xhigh`` on the newest); the
# template decides how the model reasons, but a value OpenAI refuses is refused here too.
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]

# A token budget: a positive integer (0 or a negative number is a mistake, not "no limit").
MaxTokens = Annotated[int, Field(ge=1)]
# A model name: never empty (every provider refuses one).
ModelName = Annotated[str, Field(min_length=1)]


def validate(model: type[M], data: Any, *, root: str = "body", prefix: str = "") -> M:
    """``model`` validated from ``data``; InvalidRequest naming the JSON path of the first error otherwise.

    ``prefix`` is the path of ``data`` inside the request (``input[3]``) when a part is validated alone.
    """
    if not isinstance(data, dict):
        where = prefix or root
        raise InvalidRequest(f"{where}: expected a JSON object", field=where)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        field = join_path(prefix, _json_path(first["loc"], data, missing=first["type"] == "missing")) or root
        # pydantic names the model class here ("a valid dictionary or instance of ChatBody"): say it plainly.
        message = "expected a JSON object" if first["type"] == "model_type" else first["msg"]
        raise InvalidRequest(f"{field}: {message}", field=field) from None


def checked_arguments(text: str, field: str) -> str:
    """A tool call's arguments as a client sent them (JSON text, kept verbatim), unless they are JSON this gateway
    cannot read (``parse_json_text``: nested past its limit, an integer of thousands of digits): then a 400 naming
    ``field``. Text that is not JSON at all is kept as it is: a harness may echo a model's malformed call."""
    try:
        parse_json_text(text, field)
    except NotJsonText:
        pass
    return text


def join_path(prefix: str, rest: str) -> str:
    if not rest:
        return prefix
    if not prefix or rest.startswith("["):
        return prefix + rest
    return f"{prefix}.{rest}"


def index_path(prefix: str, index: int) -> str:
    return f"{prefix}[{index}]"


def _json_path(loc: Sequence[int | str], data: Any, *, missing: bool) -> str:
    """The JSON path of a pydantic ``loc``, walked against the data.

    A loc also holds union tags (``"list"`` in ``("content", "list", 0, "text")``); they are not keys of the
    data, so they are skipped. A missing field is not in the data either; it is the loc's last element.
    """
    path, node = "", data
    for depth, key in enumerate(loc):
        last = depth == len(loc) - 1
        if isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
            path, node = f"{path}[{key}]", node[key]
        elif isinstance(node, dict) and key in node:
            path, node = join_path(path, str(key)), node[key]
        elif last and missing:
            path = join_path(path, str(key))
    return path


def parts_text(parts: Sequence[ContentPart], path: str) -> str:
    """The text of an array-form content, parts joined by newlines (as vLLM joins them).

    Text parts give their text, refusals their refusal, images the placeholder; any other part type (audio,
    files) raises InvalidRequest naming it, because dropping it would silently change the conversation.
    """
    texts: list[str] = []
    for index, part in enumerate(parts):
        where = index_path(path, index)
        if part.type in TEXT_PART_TYPES:
            if part.text is None:
                raise InvalidRequest(f"{where}.text: a {part.type} part needs a text", field=f"{where}.text")
            texts.append(part.text)
        elif part.type == "refusal":
            texts.append(part.refusal or part.text or "")
        elif part.type in IMAGE_PART_TYPES:
            texts.append(IMAGE_PLACEHOLDER)
        else:
            raise InvalidRequest(f"{where}.type: unsupported content part type {part.type!r}", field=f"{where}.type")
    return "\n".join(texts)


def content_text(content: str | Sequence[ContentPart] | None, path: str) -> str:
    """A content field that is a string, an array of parts, or null (empty)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return parts_text(content, path)


def _str_or_list(value: Any) -> str | None:
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        return "list"
    return None


# ``Annotated[Text | Annotated[list[X], Tag("list")], str_or_list("...")]`` is the type ``str | list[X]`` told apart
# by the JSON type, so errors name the real path (a plain union would report a list with one bad element as
# "Input should be a valid string").
Text = Annotated[str, Tag("str")]


def str_or_list(expected: str) -> Discriminator:
    """The discriminator of a ``str | list[...]`` field; ``expected`` is the error's wording of the type."""
    return Discriminator(_str_or_list, custom_error_type="string_or_array", custom_error_message=f"expected {expected}")


Content = Annotated[
    Text | Annotated[list[ContentPart], Tag("list")], str_or_list("a string or an array of content parts")
]


def error_response(error: PolarError, *, context_param: str) -> tuple[int, dict[str, Any]]:
    """OpenAI's ``{"error": {message, type, param, code}}`` with the error's status.

    Context overflow is the one shape clients act on: LiteLLM-based harnesses compact their history when
    they see ``code: context_length_exceeded`` with type ``invalid_request_error`` on a 400.
    """
    return error.status_code, {"error": error_object(error, context_param=context_param)}


def error_object(error: PolarError, *, context_param: str) -> dict[str, Any]:
    param: str | None
    if isinstance(error, ContextLengthExceeded):
        kind, param = "invalid_request_error", context_param
    elif isinstance(error, InvalidRequest):
        kind, param = "invalid_request_error", error.field
    else:
        kind, param = ("server_error" if error.status_code >= 500 else error.error_type), error.field
    return {"message": error.message, "type": kind, "param": param, "code": error.error_type}


def call_id(completion_id: str, index: int) -> str:
    """The id of a parsed call that has none: derived, so every rendering of one completion agrees."""
    return f"call_{completion_id}_{index}"
