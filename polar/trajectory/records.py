"""The trajectory layer's records: what builders read (``CaptureRecord``) and what they return (``Trace``,
``MergeStats``, ``BuildResult``).

All are frozen dataclasses holding tuples, so a built trace can be handed to reward and filter functions, which
return changed copies (``dataclasses.replace``) and never mutate their input. A ``CaptureRecord`` holds only the
token-path columns of a ``db.models.Capture`` (no request or response JSON), so loading a rollout for a build
stays cheap. Records validate themselves on construction: a capture whose logprobs do not align with its output,
or a trace whose mask does not align with its response, cannot exist.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from db.enums import CaptureStatus
from polar.trajectory.sampling import SamplingRange, capture_sampling

if TYPE_CHECKING:
    from db.models import Capture

PLACEHOLDER_LOGPROB = 0.0
"""Logprob written on inserted tokens (tool results, user turns, template glue) only to keep the response's
arrays aligned; the loss mask, not this value, decides what is trained."""


@dataclass(frozen=True)
class VersionRange:
    """Tokens ``[start, end)`` were sampled under weight ``version``.

    On a capture the positions index its output; on a trace they index its response, and cover sampled tokens
    only (inserted tokens were never sampled, so they have no version).
    """

    version: str
    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError(f"empty or negative version range [{self.start}, {self.end}) for {self.version!r}")

    def as_json(self) -> dict[str, Any]:
        return {"version": self.version, "start": self.start, "end": self.end}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> VersionRange:
        return cls(str(value["version"]), int(value["start"]), int(value["end"]))


@dataclass(frozen=True)
class CaptureRecord:
    """One backend call of a rollout, as the builders need it (the capture-tree contract is on ``Capture``).

    ``version_spans`` index ``output_ids``; when a capture has none but names a ``weight_version``, its whole
    output counts as sampled under that version. ``sampling_spans`` (``polar.trajectory.sampling``) say the regime
    its output was sampled under: one span over the whole output, empty where the capture stored no sampling
    parameters. ``n_malformed_tool_calls`` counts tool calls in the reply that
    the gateway could not parse. An ERROR capture has no usable output and is never trained on.
    """

    id: int
    seq: int
    parent_id: int | None
    prefix_len: int
    prompt_delta_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    output_logprobs: tuple[float, ...]
    finish_reason: str | None = None
    weight_version: str | None = None
    version_spans: tuple[VersionRange, ...] = ()
    sampling_spans: tuple[SamplingRange, ...] = ()
    status: CaptureStatus = CaptureStatus.OK
    render_mode: str = "append"
    n_malformed_tool_calls: int = 0
    scripted: bool = False  # made by a scripted policy, not sampled
    admission: str | None = None  # db.enums.Admission (root | match | unresolved); None before it was recorded
    admission_cause: str | None = None

    def __post_init__(self) -> None:
        if self.prefix_len < 0:
            raise ValueError(f"capture {self.id}: negative prefix_len {self.prefix_len}")
        if self.status is CaptureStatus.OK and len(self.output_logprobs) != len(self.output_ids):
            # A trainable token without its logprob would be trained against garbage; refuse the record.
            raise ValueError(
                f"capture {self.id}: {len(self.output_ids)} output ids but {len(self.output_logprobs)} logprobs"
            )
        ranges = [(s.start, s.end) for s in self.version_spans] + [(s.start, s.end) for s in self.sampling_spans]
        for start, end in ranges:
            if end > len(self.output_ids):
                raise ValueError(
                    f"capture {self.id}: span [{start}, {end}) beyond its {len(self.output_ids)} output tokens"
                )

    @property
    def ok(self) -> bool:
        return self.status is CaptureStatus.OK

    def sampled_versions(self) -> tuple[VersionRange, ...]:
        """Version ranges over the output, falling back to ``weight_version`` for the whole output."""
        if self.version_spans or self.weight_version is None or not self.output_ids:
            return self.version_spans
        return (VersionRange(self.weight_version, 0, len(self.output_ids)),)

    @classmethod
    def from_row(cls, row: Capture) -> CaptureRecord:
        """The record of a stored capture (any object with ``Capture``'s column attributes)."""
        return cls(
            id=row.id,
            seq=row.seq,
            parent_id=row.parent_id,
            prefix_len=row.prefix_len,
            prompt_delta_ids=tuple(row.prompt_delta_ids),
            output_ids=tuple(row.output_ids),
            output_logprobs=tuple(row.output_logprobs),
            finish_reason=row.finish_reason,
            weight_version=row.weight_version,
            # An empty span covers nothing: the gateway stored one with an empty output (an OK capture of no
            # tokens) before an empty output became a backend error, and such rows must still read.
            version_spans=tuple(
                VersionRange.from_json(span) for span in row.version_spans or () if span["end"] != span["start"]
            ),
            sampling_spans=capture_sampling(
                getattr(row, "sampling_params", None), getattr(row, "logprob_semantics", None), len(row.output_ids)
            ),
            status=CaptureStatus(row.status),
            render_mode=row.render_mode,
            n_malformed_tool_calls=row.n_malformed_tool_calls or 0,
            scripted=bool(getattr(row, "scripted", False)),
            admission=getattr(row, "admission", None),
            admission_cause=getattr(row, "admission_cause", None),
        )


@dataclass(frozen=True)
class Trace:
    """One training sequence: ``prompt_ids`` then ``response_ids``, with per-response-token loss mask and logprobs.

    Sampled tokens carry their real logprobs (also where they reappear as masked shared context); inserted
    tokens carry ``PLACEHOLDER_LOGPROB``. ``capture_ids`` follow the chain from its first capture to its leaf;
    ``finish_reason`` is the leaf's (``length``: the last reply was cut by the token limit).
    ``weight_version_min``/``max`` are the versions of the earliest- and latest-sampled tokens of the chain
    (sampling order, which is version order while weights only move forward; version strings need not sort).
    ``sampling_spans`` say the sampling regime of each sampled response position (``polar.trajectory.sampling``):
    a chain whose calls sampled differently carries one span per regime, greedy ones flagged.
    ``n_inexact_merges`` counts merges in the chain whose next prompt did not hold the sampled ids verbatim;
    ``n_malformed_tool_calls`` sums the chain's unparseable tool calls. ``reward`` is unset until assigned;
    ``filter_reason`` says why the training filter changed the trace, if it did. ``role`` is the role of the
    chain's start (``polar.trajectory.roles``: main, sub_agent, compaction, title, other), ``source_capture_id``
    the call it came from (the launching call of a sub-agent, the summarised call of a compaction, the
    compaction call of a post-compaction chain), and ``compacted`` says the chain starts from a summary.
    """

    chain_index: int
    capture_ids: tuple[int, ...]
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    response_logprobs: tuple[float, ...]
    version_spans: tuple[VersionRange, ...] = ()
    sampling_spans: tuple[SamplingRange, ...] = ()
    weight_version_min: str | None = None
    weight_version_max: str | None = None
    finish_reason: str | None = None
    n_inexact_merges: int = 0
    n_malformed_tool_calls: int = 0
    scripted: bool = False  # holds a capture of a scripted policy: never trainable
    reward: float | None = None
    filter_reason: str | None = None
    role: str = "main"
    source_capture_id: int | None = None
    compacted: bool = False
    kept: bool = False  # the chain the harness kept: the first trace through the session's terminal call

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if len(self.loss_mask) != n or len(self.response_logprobs) != n:
            raise ValueError(
                f"trace {self.chain_index}: response {n}, mask {len(self.loss_mask)} and logprobs "
                f"{len(self.response_logprobs)} tokens do not align"
            )
        if not self.capture_ids:
            raise ValueError(f"trace {self.chain_index} names no capture")
        if self.sampling_spans and self.sampling_spans[-1].end > n:
            raise ValueError(f"trace {self.chain_index}: a sampling span ends beyond its {n} response tokens")

    @property
    def turn_count(self) -> int:
        return len(self.capture_ids)

    @property
    def n_loss_tokens(self) -> int:
        return sum(self.loss_mask)

    def token_versions(self) -> list[str | None]:
        """The weight version of each response token; ``None`` on inserted tokens."""
        versions: list[str | None] = [None] * len(self.response_ids)
        for span in self.version_spans:
            versions[span.start : span.end] = [span.version] * (span.end - span.start)
        return versions


@dataclass(frozen=True)
class MergeStats:
    """What a build did with a rollout's captures.

    ``roots`` are captures without a (successful) parent: the session's first call, compactions, sub-agents.
    ``roots_by_role`` counts every labelled chain start (roots, and compaction calls cut from the chain they
    extend) by role. ``break_causes`` counts every split by cause, so none is silent: a child that started a
    chain of its own (``prompt_rewritten``, ``compaction``, ...), a second or later child of one call
    (``branch``: it still merges, but the chain splits there), and under ``per_request`` every non-root call
    (``per_request``). For both builders ``traces_out == roots + breaks``; under ``prefix_merge`` also
    ``ok_captures == roots + breaks - branches + merges``.
    ``loss_tokens`` (before any training filter) plus the poisoned and dead-branch ``untrained_tokens`` equals
    ``sampled_tokens`` for both built-in builders: every live sampled token is trained exactly once.
    """

    builder: str
    captures_in: int
    error_captures: int
    traces_out: int
    roots: int
    exact_merges: int
    inexact_merges: int
    break_causes: Mapping[str, int] = field(default_factory=dict)
    sampled_tokens: int = 0
    loss_tokens: int = 0
    roots_by_role: Mapping[str, int] = field(default_factory=dict)
    # Sampled tokens the build does not train, by reason (``polar.trajectory.liveness.Untrained``: poisoned,
    # dead_branch; unacknowledged replies are counted here too, outside ``sampled_tokens``), and after the store's
    # training filter and role choice, by the filter's reason (``role_not_trained``, ``rollout_error``, ...).
    untrained_tokens: Mapping[str, int] = field(default_factory=dict)
    trainable_tokens: int | None = None  # loss tokens after the training filter (None: not filtered yet)
    # Roots after the session's first call, by the cause the gateway recorded (``captures.admission_cause``).
    root_causes: Mapping[str, int] = field(default_factory=dict)
    # Why the session's last main call has no clean answer (``polar.trajectory.liveness.Unfinished``), or None.
    unfinished: str | None = None

    def token_line(self) -> str:
        """Sampled, trainable (after the filter, when known) and untrained tokens by reason, and root causes."""
        trainable = self.trainable_tokens if self.trainable_tokens is not None else self.loss_tokens
        untrained = ", ".join(f"{k} {v}" for k, v in self.untrained_tokens.items()) or "none"
        causes = ", ".join(f"{k} {v}" for k, v in self.root_causes.items()) or "none"
        return f"sampled {self.sampled_tokens}, trainable {trainable}, untrained: {untrained}; root causes: {causes}"

    @property
    def ok_captures(self) -> int:
        return self.captures_in - self.error_captures

    @property
    def breaks(self) -> int:
        return sum(self.break_causes.values())

    @property
    def merges(self) -> int:
        return self.exact_merges + self.inexact_merges

    @property
    def merge_ratio(self) -> float:
        """OK captures per trace (the anchor's 1,185 -> 218 is a ratio of 5.4)."""
        return self.ok_captures / self.traces_out if self.traces_out else 0.0

    @property
    def exact_rate(self) -> float | None:
        """Share of merges whose next prompt held the sampled ids verbatim; ``None`` without merges."""
        return self.exact_merges / self.merges if self.merges else None


@dataclass(frozen=True)
class BuildResult:
    builder: str
    traces: tuple[Trace, ...]
    stats: MergeStats


def merged_spans(spans: Sequence[VersionRange]) -> tuple[VersionRange, ...]:
    """``spans`` (in order) with touching ranges of the same version joined."""
    out: list[VersionRange] = []
    for span in spans:
        if out and out[-1].version == span.version and out[-1].end == span.start:
            out[-1] = VersionRange(span.version, out[-1].start, span.end)
        else:
            out.append(span)
    return tuple(out)


def version_bounds(spans: Sequence[VersionRange]) -> tuple[str | None, str | None]:
    """Versions of the first and last sampled tokens (see ``Trace``)."""
    if not spans:
        return None, None
    return spans[0].version, spans[-1].version
