"""The Backend protocol and the records that cross it.

A backend generates from token ids. It returns the sampled ids exactly as the inference server produced
them (the matched stop token included, as SGLang does), one logprob per sampled id, a finish reason, and
the weight-version spans that the output tokens were sampled under.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from polar.errors import InvalidRequest, UnknownSamplingParameter


class FinishReason(StrEnum):
    STOP = "stop"  # an end-of-turn / stop token or a stop string was matched
    LENGTH = "length"  # max_new_tokens or the context window was reached
    ABORT = "abort"  # the server aborted the request (pause in abort mode, explicit abort)


class LogprobSemantics(StrEnum):
    """What a logprob means. SGLang scales by temperature when sampling; vLLM (default) does not."""

    TEMPERATURE_SCALED = "temperature_scaled"  # log_softmax(logits / T); raw when greedy (SGLang)
    RAW = "raw"  # log_softmax(logits) regardless of temperature (vLLM raw_logprobs)


class SamplingParams(BaseModel):
    """Sampling parameters, named as SGLang names them. Unknown names are rejected, not dropped."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_new_tokens: int = Field(default=128, ge=0)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    min_new_tokens: int = Field(default=0, ge=0)
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop_string(cls, value: object) -> object:
        return (value,) if isinstance(value, str) else value

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int) -> int:
        if value == 0 or value < -1:
            raise ValueError("top_k must be -1 (all tokens) or a positive integer")
        return value

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> SamplingParams:
        """Validate a dict, turning pydantic's errors into Polar errors that name the field."""
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            name = ".".join(str(p) for p in first["loc"]) or "sampling_params"
            if first["type"] == "extra_forbidden":
                known = ", ".join(cls.model_fields)
                raise UnknownSamplingParameter(
                    f"unknown sampling parameter {name!r}; expected one of {known}", field=name
                ) from None
            raise InvalidRequest(f"invalid sampling parameter {name!r}: {first['msg']}", field=name) from None

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-6  # SGLang's _SAMPLING_EPS: treated as top_k=1


@dataclass(frozen=True)
class VersionSpan:
    """Output tokens [start, end) were sampled under weight ``version``."""

    version: str
    start: int
    end: int


@dataclass(frozen=True)
class ExtrasRequest:
    """What a call asks beyond sampled ids and their logprobs (see ``polar.backends.extras`` for the wire).

    ``top_logprobs``: the k most likely ids and their logprobs at every sampled position (0: none), with the
    sampled id's own semantics. ``routed_experts``: the MoE experts each layer routed every position of
    ``[routed_experts_start, prompt + output - 1)`` to (SGLang's ``routed_experts_start_len``: the last sampled id
    is never fed to the model, and a call extending its parent asks only for the positions its parent lacks).
    ``token_ids``: ids whose logprobs are wanted at every sampled position (SGLang's ``token_ids_logprob``).
    """

    top_logprobs: int = 0
    routed_experts: bool = False
    routed_experts_start: int = 0
    token_ids: tuple[int, ...] = ()

    @property
    def any(self) -> bool:
        return bool(self.top_logprobs or self.routed_experts or self.token_ids)


@dataclass(frozen=True, eq=False)
class GenerateExtras:
    """The extras of one generation (or, on a stream chunk, of its new tokens), as numpy arrays.

    ``top_ids`` int32 and ``top_logprobs`` float32, both (n_output, k); ``token_ids_logprobs`` float32
    (n_output, len(ExtrasRequest.token_ids)); ``routed_experts`` (rows, layers, k) uint8 or uint16 for the
    positions ``[routed_experts_start, routed_experts_start + rows)``. A field not asked for is None.
    """

    top_ids: Any = None
    top_logprobs: Any = None
    token_ids_logprobs: Any = None
    routed_experts: Any = None
    routed_experts_start: int = 0


@dataclass(frozen=True)
class GenerateRequest:
    input_ids: Sequence[int]  # a tuple or list, or an int32 array (a long append-mode prompt)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    request_id: str | None = None
    session_id: str | None = None  # the gateway session (rollout) it belongs to: a fleet routes on it
    extras: ExtrasRequest | None = None  # top-k logprobs, routed experts (None: neither)
    # ``input_ids`` as one JSON array, in parts to join (polar.tokens.ids_json), when the caller holds most of it
    # encoded already (a session's earlier turns); a backend that sends JSON uses it, any other ignores it.
    input_ids_json: tuple[bytes, ...] | None = None


@dataclass(frozen=True)
class GenerateResult:
    output_ids: tuple[int, ...]
    output_logprobs: tuple[float, ...]
    finish_reason: FinishReason
    matched_stop: int | str | None
    version_spans: tuple[VersionSpan, ...]
    prompt_tokens: int
    logprob_semantics: LogprobSemantics
    ttft_s: float | None = None
    e2e_s: float | None = None
    server: str | None = None  # which server of a fleet produced it (polar.backends.fleet); None for one server
    extras: GenerateExtras | None = None  # what ``GenerateRequest.extras`` asked for

    @property
    def weight_version(self) -> str | None:
        return self.version_spans[-1].version if self.version_spans else None


@dataclass(frozen=True)
class GenerateChunk:
    """New output tokens since the previous chunk; the last chunk carries ``final``."""

    output_ids: tuple[int, ...]
    output_logprobs: tuple[float, ...]
    final: GenerateResult | None = None
    extras: GenerateExtras | None = None  # the new tokens' top-k logprobs, when asked (never routed experts)


@dataclass(frozen=True)
class WeightUpdate:
    """New policy weights labelled ``version``: a checkpoint folder the server can read (safetensors), in-memory
    tensors (the in-process local backend only), or neither (relabel the live weights)."""

    version: str
    path: str | None = None
    tensors: dict[str, Any] | None = None  # name -> torch.Tensor


@runtime_checkable
class Backend(Protocol):
    """Token-in/token-out generation. Implementations: local, sglang, vllm, and fleet over several (see
    ``polar.backends``)."""

    name: str

    @property
    def context_length(self) -> int: ...

    async def generate(self, request: GenerateRequest) -> GenerateResult: ...

    def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]: ...

    async def weight_version(self) -> str: ...

    async def update_weights(self, update: WeightUpdate) -> None:
        """Serve ``update`` from the next decode step on. Generations in flight are paused, not aborted: they
        go on under the new weights and record the switch in their version spans."""
        ...

    async def aclose(self) -> None: ...


def spans_from_events(events: list[tuple[str, int]], final_version: str, n_output: int) -> tuple[VersionSpan, ...]:
    """SGLang's compute_weight_version_spans: ``events`` are (old_version, n_output_tokens_at_update)."""
    spans: list[VersionSpan] = []
    start = 0
    for old_version, at in events:
        if at > start:
            spans.append(VersionSpan(old_version, start, at))
            start = at
    spans.append(VersionSpan(final_version, start, n_output))
    # Adjacent spans with the same version (an update to the same label) collapse into one.
    merged: list[VersionSpan] = []
    for span in spans:
        if merged and merged[-1].version == span.version:
            merged[-1] = VersionSpan(span.version, merged[-1].start, span.end)
        else:
            merged.append(span)
    return tuple(merged)


async def collect(chunks: AsyncIterator[GenerateChunk]) -> GenerateResult:
    """Drain a stream and return its final result."""
    final = None
    async for chunk in chunks:
        final = chunk.final or final
    if final is None:
        from polar.errors import BackendProtocolError

        raise BackendProtocolError("stream ended without a final chunk")
    return final
