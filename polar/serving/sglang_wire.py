"""SGLang's native request bodies, validated into engine requests.

``prepare_generate`` turns a ``/generate`` body into a :class:`PreparedGenerate` the way SGLang's
``GenerateReqInput`` + contract gate + ``TokenizerManager._validate_one_request`` do:

- exactly one of ``text`` / ``input_ids`` (text is tokenized with the served tokenizer);
- unknown top-level keys are ignored, unknown ``sampling_params`` keys are a 400;
- ``max_new_tokens`` defaults to 128; ``sampling_seed`` is SGLang's name for the seed;
- a prompt at or over the context length, or prompt + ``max_new_tokens`` reaching it, is a 400 with
  SGLang's own message (which names the context length).

Batches (a list of texts or of id lists, list-valued ``sampling_params`` / ``rid``, ``n > 1``) are
rejected with ``BATCH_NOT_SUPPORTED``: one request is one generation here. Top logprobs
(``top_logprobs_num``), chosen ids' logprobs (``token_ids_logprob``, both with ``return_logprob``) and routed
experts (``return_routed_experts`` from ``routed_experts_start_len``; a MoE model, and like SGLang only when the
server was started with ``--enable-return-routed-experts``, else silently left out) become the request's
``ExtrasRequest``. Features the engine cannot provide (input logprobs, constrained decoding, penalties other
than neutral) are rejected by name rather than silently ignored, so a caller never receives less than it asked for.

The small control bodies (weights, pause, tokenize) are pydantic models; :func:`parse_body` turns their
validation errors into :class:`InvalidRequest` naming the field.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from polar.errors import ContextLengthExceeded, InvalidRequest, UnknownSamplingParameter, invalid_from
from polar.inference import ExtrasRequest, GenerateRequest, SamplingParams

BATCH_NOT_SUPPORTED = "batch requests are not supported by this server"

# Every key SGLang's SamplingParams (and its api/v1 contract) accepts; anything else is a 400 there too.
SGLANG_SAMPLING_KEYS = (
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "custom_params",
    "stream_interval",
    "logit_bias",
    "sampling_seed",
)
# Keys the engine implements, under the same names as polar's SamplingParams (sampling_seed -> seed).
_ENGINE_KEYS = (
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "min_new_tokens",
    "stop",
    "stop_token_ids",
    "ignore_eos",
)
# Accepted only at the value that changes nothing, because the engine does not implement them.
_NEUTRAL_VALUES: dict[str, float] = {"frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0}
_UNSUPPORTED_UNLESS_NULL = (
    "stop_regex",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "logit_bias",
    "custom_params",
)


@dataclass(frozen=True)
class OutputOptions:
    """How a generation is rendered on the wire (none of these change the sampled ids)."""

    return_logprob: bool = False
    return_text_in_logprobs: bool = False
    return_prompt_token_ids: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    stream_interval: int = 1


@dataclass(frozen=True)
class PreparedGenerate:
    """A validated ``/generate`` request: what to generate and how to answer."""

    rid: str
    request: GenerateRequest
    options: OutputOptions
    stream: bool

    @property
    def max_new_tokens(self) -> int:
        return self.request.sampling.max_new_tokens


class _GenerateBody(BaseModel):
    """The top level of SGLang's GenerateReqInput that this server reads; other keys are ignored."""

    model_config = ConfigDict(extra="ignore")

    text: str | list[Any] | None = None
    input_ids: list[Any] | None = None
    input_embeds: Any = None
    sampling_params: dict[str, Any] | list[Any] | None = None
    return_logprob: bool | list[Any] = False
    logprob_start_len: int | list[Any] = -1
    top_logprobs_num: int | list[Any] = 0
    token_ids_logprob: list[Any] | None = None
    return_text_in_logprobs: bool = False
    stream: bool = False
    rid: str | list[Any] | None = None
    return_prompt_token_ids: bool = False
    return_hidden_states: bool | list[Any] = False
    return_routed_experts: bool = False
    routed_experts_start_len: int = 0


def prepare_generate(
    raw: object,
    *,
    tokenizer_encode: Callable[[str], list[int]],
    vocab_size: int,
    context_length: int,
    routed_experts_enabled: bool = False,
) -> PreparedGenerate:
    """Validate a ``/generate`` body; raise :class:`InvalidRequest` (or a subclass) naming the field."""
    body = parse_body(raw, _GenerateBody)
    _reject_batches(body)
    if body.input_embeds is not None:
        raise InvalidRequest(
            "input_embeds is not supported by this server; send text or input_ids", field="input_embeds"
        )
    if (body.text is None) == (body.input_ids is None):
        raise InvalidRequest("exactly one of text or input_ids must be given", field="input_ids")
    if body.return_hidden_states:
        raise InvalidRequest("return_hidden_states is not supported by this server", field="return_hidden_states")
    if body.return_logprob and body.logprob_start_len != -1:
        # Input logprobs need a teacher-forced pass over the prompt, which generation does not provide.
        raise InvalidRequest(
            "input token logprobs (logprob_start_len >= 0) are not supported by this server; use -1",
            field="logprob_start_len",
        )
    # Lists were refused as batches above, so text is a str and sampling_params a dict (or absent).
    input_ids = tokenizer_encode(body.text) if isinstance(body.text, str) else _token_ids(body.input_ids)
    _check_prompt(input_ids, vocab_size, context_length)
    raw_sampling = body.sampling_params if isinstance(body.sampling_params, dict) else {}
    sampling, decoding = parse_sampling(raw_sampling, len(input_ids), context_length)
    _check_total(len(input_ids), sampling.max_new_tokens, context_length)
    rid = body.rid if isinstance(body.rid, str) else uuid.uuid4().hex
    extras = _extras(body, routed_experts_enabled)
    options = replace(
        decoding,
        return_logprob=bool(body.return_logprob),
        return_text_in_logprobs=body.return_text_in_logprobs,
        return_prompt_token_ids=body.return_prompt_token_ids,
    )
    request = GenerateRequest(tuple(input_ids), sampling, rid, extras=extras if extras.any else None)
    return PreparedGenerate(rid, request, options, body.stream)


def _extras(body: _GenerateBody, routed_experts_enabled: bool) -> ExtrasRequest:
    """What the body asks beyond the sampled ids. As in SGLang, top-k and chosen-id logprobs come only with
    ``return_logprob``, and routed experts only from a server started with ``--enable-return-routed-experts``."""
    top = body.top_logprobs_num if isinstance(body.top_logprobs_num, int) else 0
    if top < 0:
        raise InvalidRequest("top_logprobs_num must not be negative", field="top_logprobs_num")
    chosen = body.token_ids_logprob or []
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in chosen):
        raise InvalidRequest("token_ids_logprob must be a list of integers", field="token_ids_logprob")
    token_ids = tuple(chosen)
    with_logprobs = bool(body.return_logprob)
    return ExtrasRequest(
        top_logprobs=top if with_logprobs else 0,
        routed_experts=body.return_routed_experts and routed_experts_enabled,
        routed_experts_start=body.routed_experts_start_len,
        token_ids=token_ids if with_logprobs else (),
    )


def parse_sampling(
    raw: dict[str, Any], prompt_tokens: int, context_length: int
) -> tuple[SamplingParams, OutputOptions]:
    """Split SGLang sampling params into the engine's SamplingParams and the options that only shape output
    (detokenization, stream interval); the returned OutputOptions has the other fields at their defaults."""
    for key in raw:
        if key not in SGLANG_SAMPLING_KEYS:
            raise UnknownSamplingParameter(
                f"unknown sampling parameter {key!r}; expected one of {', '.join(SGLANG_SAMPLING_KEYS)}",
                field=f"sampling_params.{key}",
            )
    if raw.get("n") not in (None, 1):
        raise InvalidRequest(BATCH_NOT_SUPPORTED, field="sampling_params.n")
    for key, neutral in _NEUTRAL_VALUES.items():
        if raw.get(key) not in (None, neutral):
            raise InvalidRequest(
                f"sampling parameter {key!r} is not supported by this server (only {neutral} is accepted)",
                field=f"sampling_params.{key}",
            )
    for key in _UNSUPPORTED_UNLESS_NULL:
        if raw.get(key) is not None:
            raise InvalidRequest(
                f"sampling parameter {key!r} is not supported by this server", field=f"sampling_params.{key}"
            )
    engine = {key: raw[key] for key in _ENGINE_KEYS if raw.get(key) is not None}
    if "max_new_tokens" in raw and raw["max_new_tokens"] is None:
        engine["max_new_tokens"] = max(0, context_length - prompt_tokens - 1)  # SGLang: None = up to the window
    if raw.get("sampling_seed") is not None:
        engine["seed"] = raw["sampling_seed"]
    params = SamplingParams.parse(engine)
    output = OutputOptions(
        skip_special_tokens=_flag(raw, "skip_special_tokens", True),
        no_stop_trim=_flag(raw, "no_stop_trim", False),
        stream_interval=_positive_int(raw, "stream_interval", 1),
    )
    _flag(raw, "spaces_between_special_tokens", True)  # validated only: the byte-level decoder adds no spaces
    return params, output


def _check_prompt(input_ids: list[int], vocab_size: int, context_length: int) -> None:
    """SGLang's prompt checks; the context message is SGLang's own (clients recognise it)."""
    if not input_ids:
        raise InvalidRequest(
            "the prompt is empty: input_ids (or the tokenized text) must not be empty", field="input_ids"
        )
    bad = next((i for i in input_ids if not 0 <= i < vocab_size), None)
    if bad is not None:
        raise InvalidRequest(f"input_ids contains {bad}, outside the vocabulary [0, {vocab_size})", field="input_ids")
    n = len(input_ids)
    if n >= context_length:
        raise context_error(
            f"The input ({n} tokens) is longer than the model's context length ({context_length} tokens).",
            n,
            context_length,
        )


def _check_total(n: int, max_new_tokens: int, context_length: int) -> None:
    """SGLang rejects (rather than truncates) a request whose prompt + max_new_tokens reaches the window."""
    if max_new_tokens + n >= context_length:
        raise context_error(
            f"Requested token count exceeds the model's maximum context length of {context_length} tokens. "
            f"You requested a total of {max_new_tokens + n} tokens: {n} tokens from the input messages and "
            f"{max_new_tokens} tokens for the completion. Please reduce the number of tokens in the input "
            f"messages or the completion to fit within the limit.",
            n,
            context_length,
        )


def context_error(message: str, prompt_tokens: int, context_length: int) -> ContextLengthExceeded:
    """A ContextLengthExceeded that carries ``message`` verbatim (SGLang's wording, not polar's)."""
    exc = ContextLengthExceeded(prompt_tokens, context_length)
    exc.message = message
    exc.args = (message,)
    return exc


def _reject_batches(body: _GenerateBody) -> None:
    batched = (
        isinstance(body.text, list)
        or (body.input_ids is not None and any(isinstance(i, list) for i in body.input_ids))
        or isinstance(body.sampling_params, list)
        or isinstance(body.rid, list)
        or isinstance(body.return_logprob, list)
    )
    if batched:
        raise InvalidRequest(BATCH_NOT_SUPPORTED, field="input_ids")


def _token_ids(values: list[Any] | None) -> list[int]:
    ids = values or []
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise InvalidRequest("input_ids must be a list of integers", field="input_ids")
    return ids


def _flag(raw: dict[str, Any], key: str, default: bool) -> bool:
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(f"sampling parameter {key!r} must be a boolean", field=f"sampling_params.{key}")
    return value


def _positive_int(raw: dict[str, Any], key: str, default: int) -> int:
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidRequest(f"sampling parameter {key!r} must be a positive integer", field=f"sampling_params.{key}")
    return value


# ---- control bodies ---------------------------------------------------------------------------------


class UpdateWeightsFromDiskBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model_path: str
    weight_version: str | None = None
    abort_all_requests: bool = False
    flush_cache: bool = True
    load_format: str | None = None


class UpdateWeightVersionBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    new_version: str
    abort_all_requests: bool = True


class PauseBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    mode: Literal["abort", "retract", "in_place"] = "abort"


class AbortBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    rid: str = ""
    abort_all: bool = False


class TokenizeBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    prompt: str | list[str]
    add_special_tokens: bool = True  # accepted; these tokenizers never add special tokens of their own


class DetokenizeBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    tokens: list[int] | list[list[int]]
    skip_special_tokens: bool = True


ModelT = TypeVar("ModelT", bound=BaseModel)


def parse_body(raw: object, model: type[ModelT]) -> ModelT:
    """Validate a decoded JSON body against ``model``; errors become InvalidRequest naming the field."""
    if not isinstance(raw, dict):
        raise InvalidRequest("the request body must be a JSON object", field="body")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise invalid_from(exc, "request") from None
