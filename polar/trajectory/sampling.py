"""Sampling spans: the sampling regime each sampled token was drawn under, beside its weight version.

A capture is one generation, so one regime covers its whole output: the ``sampling_params`` the gateway sent the
engine (temperature, top_p, top_k, min_p) and the ``logprob_semantics`` the backend reported (what its logprobs
mean: ``temperature_scaled`` = ``log_softmax(logits / T)``, ``raw`` = ``log_softmax(logits)``; greedy tokens carry
raw logprobs under both). A trace joins its calls' outputs, so it may mix regimes (a harness that calls at
temperature 1.0, then 0.3 with top_p 0.9, then greedily): its ``sampling_spans`` say which response positions
came from which. Like version spans they cover sampled tokens only; a sampled token outside every span was made
by a capture that recorded no sampling parameters (none before the gateway stored them), so its regime is unknown.

Greedy (``greedy: true``) is SGLang's rule: a temperature under 1e-6, which the engines treat as top_k 1, or
top_k 1 itself. A greedy token was not drawn from a distribution: an importance ratio against its stored logprob
means nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

GREEDY_TEMPERATURE = 1e-6  # SGLang's _SAMPLING_EPS: below it a request is greedy (polar.inference.SamplingParams)


@dataclass(frozen=True)
class SamplingRange:
    """Tokens ``[start, end)`` were sampled at ``temperature`` with ``top_p``/``top_k``/``min_p`` (``top_k`` -1:
    no cut, ``min_p`` 0: none), their logprobs meaning ``logprob_semantics`` (None: the backend did not say).

    On a capture the positions index its output; on a trace they index its response (sampled tokens only)."""

    start: int
    end: int
    temperature: float
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    logprob_semantics: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError(f"empty or negative sampling range [{self.start}, {self.end})")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    def same_regime(self, other: SamplingRange) -> bool:
        return _regime(self) == _regime(other)

    def shifted(self, offset: int) -> SamplingRange:
        return replace(self, start=self.start + offset, end=self.end + offset)

    def as_json(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "end": self.end,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "logprob_semantics": self.logprob_semantics,
            "greedy": self.greedy,
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> SamplingRange:
        semantics = value.get("logprob_semantics")
        return cls(
            int(value["start"]),
            int(value["end"]),
            float(value["temperature"]),
            float(value.get("top_p", 1.0)),
            int(value.get("top_k", -1)),
            float(value.get("min_p", 0.0)),
            str(semantics) if semantics is not None else None,
        )


def _regime(span: SamplingRange) -> tuple[float, float, int, float, str | None]:
    return (span.temperature, span.top_p, span.top_k, span.min_p, span.logprob_semantics)


def capture_sampling(
    sampling_params: Mapping[str, Any] | None, logprob_semantics: str | None, n_output: int
) -> tuple[SamplingRange, ...]:
    """The one span of a capture's output, from its stored ``sampling_params`` and ``logprob_semantics``; none
    for an empty output or a capture that stored no temperature (its regime is unknown, not assumed)."""
    params = sampling_params or {}
    if n_output <= 0 or params.get("temperature") is None:
        return ()
    return (
        SamplingRange(
            0,
            n_output,
            float(params["temperature"]),
            float(params.get("top_p", 1.0)),
            int(params.get("top_k", -1)),
            float(params.get("min_p", 0.0)),
            logprob_semantics,
        ),
    )


def merged_sampling(spans: Sequence[SamplingRange]) -> tuple[SamplingRange, ...]:
    """``spans`` (in order) with touching ranges of the same regime joined."""
    out: list[SamplingRange] = []
    for span in spans:
        if out and out[-1].end == span.start and out[-1].same_regime(span):
            out[-1] = replace(out[-1], end=span.end)
        else:
            out.append(span)
    return tuple(out)
