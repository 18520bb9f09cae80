"""What a trainer adapter does with a sample whose tokens were sampled under regimes its trainer does not assume.

Every trajectory carries ``sampling_spans`` (``polar.trajectory.sampling``): per span of response positions, the
temperature, top_p, top_k, min_p and logprob semantics its tokens were sampled with, greedy ones flagged. The
adapters always pass them through (``Sample.sampling_spans``). A trainer that computes importance ratios from the
stored logprobs assumes each one is ``log_softmax(logits / T)`` of a token drawn at its own ``T`` with its own
truncation; a token sampled otherwise would get a wrong weight without a word. ``mask_mismatched`` zeroes the loss
mask of exactly those tokens, and says why:

- greedy (temperature 0 or top_k 1): drawn from no distribution, its stored logprob is raw;
- another temperature than the trainer's;
- ``raw`` logprobs (vLLM's default) at a temperature other than 1: they are not ``log_softmax(logits / T)``;
- no recorded semantics, or no span at all (a trajectory built before revision 0020: rebuild it);
- another top_p, top_k or min_p than the trainer's.

A sample left with no loss token is masked whole (reward None), as ``polar.integrations.groups`` masks any sample
that cannot train.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from polar.integrations.groups import Sample
from polar.trajectory.sampling import GREEDY_TEMPERATURE


@dataclass(frozen=True)
class TrainerSampling:
    """What the trainer's importance ratio assumes of a behaviour logprob: the token was drawn at ``temperature``
    with ``top_p``/``top_k``/``min_p`` (-1 and 0: no cut), its logprob ``log_softmax(logits / temperature)``."""

    temperature: float
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0

    @classmethod
    def of(cls, temperature: Any, top_p: Any = None, top_k: Any = None, min_p: Any = None) -> TrainerSampling:
        """From a trainer's settings, where ``None`` or a top_k of 0 or below means no cut (TRL, verl)."""
        k = int(top_k) if top_k is not None else -1
        return cls(
            float(temperature),
            float(top_p) if top_p is not None else 1.0,
            k if k > 0 else -1,
            float(min_p) if min_p is not None else 0.0,
        )


def mismatch(span: Mapping[str, Any], assumed: TrainerSampling) -> str | None:
    """Why the logprobs of ``span`` (a stored sampling span) do not fit ``assumed``; None when they do."""
    temperature = float(span["temperature"])
    top_k = int(span.get("top_k", -1))
    if span.get("greedy") or temperature < GREEDY_TEMPERATURE or top_k == 1:
        return "greedy"
    if abs(temperature - assumed.temperature) > 1e-6:
        return f"temperature {temperature:g}, the trainer's {assumed.temperature:g}"
    semantics = span.get("logprob_semantics")
    if semantics is None:
        return "logprob semantics not recorded"
    if semantics == "raw" and abs(temperature - 1.0) > 1e-6:
        return f"raw logprobs at temperature {temperature:g}"
    top_k = top_k if top_k > 0 else -1
    for name, ours, theirs in (
        ("top_p", float(span.get("top_p", 1.0)), assumed.top_p),
        ("top_k", top_k, assumed.top_k),
        ("min_p", float(span.get("min_p", 0.0)), assumed.min_p),
    ):
        if abs(ours - theirs) > 1e-9:
            return f"{name} {ours:g}, the trainer's {theirs:g}"
    return None


def mask_mismatched(sample: Sample, assumed: TrainerSampling) -> Sample:
    """``sample`` with the loss tokens its trainer cannot weigh masked (see the module docstring); unchanged when
    every loss token fits. ``sampling_masked`` says how many were masked and why."""
    reasons: list[str | None] = [None] * len(sample.loss_mask)
    unrecorded = "sampling regime not recorded (a trajectory built before revision 0020: rebuild it)"
    covered = [False] * len(sample.loss_mask)
    for span in _spans(sample.sampling_spans):
        why = mismatch(span, assumed)
        for i in range(int(span["start"]), min(int(span["end"]), len(reasons))):
            covered[i] = True
            reasons[i] = why
    counts: Counter[str] = Counter()
    mask = list(sample.loss_mask)
    for i, trained in enumerate(mask):
        why = reasons[i] if covered[i] else unrecorded
        if trained and why is not None:
            mask[i] = 0
            counts[why] += 1
    if not counts:
        return sample
    lost = sum(counts.values())
    said = "; ".join(f"{why} ({n})" for why, n in counts.most_common())
    note = f"{lost} of {sum(sample.loss_mask)} loss tokens masked, sampled unlike the trainer assumes: {said}"
    if any(mask):
        return replace(sample, loss_mask=mask, sampling_masked=note)
    return replace(sample, loss_mask=mask, sampling_masked=note, reward=None, masked_reason=note)


def _spans(spans: Sequence[Mapping[str, Any]] | None) -> Sequence[Mapping[str, Any]]:
    return spans or ()
