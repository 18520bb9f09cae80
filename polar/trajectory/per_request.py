"""The ``per_request`` builder: one trace per successful capture, exactly as it was sampled.

The prompt is the capture's full prompt, the response its output ids, all trainable, with their logprobs and
version and sampling spans. Nothing is merged, so a session of N calls gives N traces whose prompts repeat the shared
history N times; the anchor's ablation found 5.4x more trainer updates than ``prefix_merge`` on the same data.
With an outcome reward broadcast to every trace, long sessions then weigh more than short ones (the anchor saw
reward hacking): pair it with per-trace rewards or ``Normalization.SESSION`` (``polar.trajectory.rewards``).
"""

from __future__ import annotations

from collections.abc import Iterable

from polar.trajectory.liveness import judge, root_causes, untrained_tokens
from polar.trajectory.records import BuildResult, CaptureRecord, MergeStats, Trace, merged_spans, version_bounds
from polar.trajectory.roles import Role, SessionRoles, label_session
from polar.trajectory.sampling import merged_sampling
from polar.trajectory.tree import CaptureTree

NAME = "per_request"


def per_request(captures: Iterable[CaptureRecord], /, *, roles: SessionRoles | None = None) -> BuildResult:
    """One trace per OK capture, in ``seq`` order; ERROR captures are counted in the stats and left out; poisoned
    calls and dead retries (``polar.trajectory.liveness``) keep a zero mask. Each
    trace carries the role and link of the chain start its capture belongs to."""
    tree = CaptureTree(captures)
    roles = roles if roles is not None else label_session(tree)
    liveness = judge(tree, lambda capture_id: roles.label_of(capture_id).role is Role.MAIN)
    traces: list[Trace] = []
    roots = 0
    for record in tree.ok:
        roots += tree.link(record).parent is None
        spans = merged_spans(record.sampled_versions())
        label = roles.label_of(record.id)
        low, high = version_bounds(spans)
        traces.append(
            Trace(
                chain_index=len(traces),
                capture_ids=(record.id,),
                prompt_ids=tree.full_prompt(record),
                response_ids=record.output_ids,
                loss_mask=(0 if liveness.reason(record.id) else 1,) * len(record.output_ids),
                response_logprobs=record.output_logprobs,
                version_spans=spans,
                sampling_spans=merged_sampling(record.sampling_spans),
                weight_version_min=low,
                weight_version_max=high,
                finish_reason=record.finish_reason,
                n_malformed_tool_calls=record.n_malformed_tool_calls,
                role=label.role.value,
                source_capture_id=label.link_id,
                compacted=label.compacted,
                kept=record.id == liveness.terminal,
            )
        )
    sampled = sum(len(trace.response_ids) for trace in traces)
    stats = MergeStats(
        builder=NAME,
        captures_in=len(tree.records),
        error_captures=len(tree.records) - len(traces),
        traces_out=len(traces),
        roots=roots,
        exact_merges=0,
        inexact_merges=0,
        # Every non-root capture is cut from its parent here: the builder's choice, counted so no split is silent.
        break_causes={"per_request": len(traces) - roots} if len(traces) > roots else {},
        sampled_tokens=sampled,
        loss_tokens=sum(trace.n_loss_tokens for trace in traces),
        roots_by_role=roles.counts(),
        untrained_tokens=untrained_tokens(tree, liveness),
        root_causes=root_causes(tree),
        unfinished=liveness.unfinished,
    )
    return BuildResult(NAME, tuple(traces), stats)
