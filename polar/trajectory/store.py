"""Trajectories in the store: load a rollout's captures as records, label its chains (roles, from the calls and
the harness's role hints), build them with a named builder, assign rewards as the task's builder options route
them, apply the training filter and the role choice, and replace the rollout's rows for that builder in one
transaction.

Captures are only ever read. Functions here work inside the caller's session and transaction (wrap them in
``db.engine.session_scope``); ``build_and_store`` locks the rollout row first, so two builds of the same rollout
serialise instead of colliding on the (rollout, builder, chain) unique index. Rows a trainer has already claimed
(``consumed_by``) are never replaced: a rebuild would hand the same samples out twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from db.enums import RolloutStatus
from db.models import Capture, Evaluation, MergeStat, Rollout, Task, Trajectory
from polar.errors import NotFound, PolarError
from polar.trajectory.call_views import load_call_views, role_hints_for
from polar.trajectory.choices import BuilderOptions, RewardRouting, route_rewards, select_roles
from polar.trajectory.records import BuildResult, CaptureRecord, MergeStats, Trace, VersionRange
from polar.trajectory.registry import get_builder
from polar.trajectory.rewards import RewardKey, assign_trace_rewards
from polar.trajectory.roles import SessionRoles, label_session
from polar.trajectory.sampling import SamplingRange
from polar.trajectory.training_filter import aligned_timeout_from_stage_results, apply_training_filter

# Only the token-path columns: request/response JSON can dwarf the token arrays and no builder reads it.
_RECORD_COLUMNS = (
    Capture.id,
    Capture.seq,
    Capture.parent_id,
    Capture.prefix_len,
    Capture.prompt_delta_ids,
    Capture.output_ids,
    Capture.output_logprobs,
    Capture.finish_reason,
    Capture.weight_version,
    Capture.version_spans,
    Capture.sampling_params,
    Capture.logprob_semantics,
    Capture.status,
    Capture.render_mode,
    Capture.n_malformed_tool_calls,
    Capture.scripted,
    Capture.admission,
    Capture.admission_cause,
)


class TrajectoriesConsumed(PolarError):
    """A rollout's trajectories for a builder were claimed by a trainer and cannot be replaced."""

    status_code = 409
    error_type = "conflict_error"


def load_capture_records(session: Session, rollout_id: str) -> list[CaptureRecord]:
    """Every capture of ``rollout_id`` (failed ones included), as records in ``seq`` order."""
    rows = session.execute(sa.select(*_RECORD_COLUMNS).where(Capture.rollout_id == rollout_id).order_by(Capture.seq))
    return [CaptureRecord.from_row(row) for row in rows]  # type: ignore[arg-type]  # rows carry the same attributes


def build_and_store(
    session: Session,
    rollout_id: str,
    *,
    builder: str = "prefix_merge",
    outcome_reward: float | None = None,
    trace_rewards: Mapping[int, float] | None = None,
    reward_key: RewardKey = RewardKey.CAPTURE,
    status: RolloutStatus | str | None = None,
    aligned_agent_timeout: bool | None = None,
    options: BuilderOptions | None = None,
) -> BuildResult:
    """Build ``rollout_id``'s traces with ``builder`` and replace its stored trajectories and merge stats for it.

    Chains are labelled first (``load_session_roles``). Rewards: ``trace_rewards`` (see ``assign_trace_rewards``)
    if given, else ``outcome_reward``, else the rollout's own ``reward``, routed by ``options.reward``
    (``polar.trajectory.choices``; per-role rewards come from the latest evaluation's ``details["role_rewards"]``);
    with none of these, rewards stay NULL until a later call. ``options`` defaults to the task's
    ``builder_options``; roles outside ``options.train_roles`` keep their rows with a zeroed mask.
    The training filter judges the rollout by ``status`` (default: the rollout's status; the run stage knows the
    outcome before the row reaches a terminal status) and ``aligned_agent_timeout`` (default: read from
    ``stage_results``). Returns what was written. Raises ``NotFound`` for an unknown rollout and
    ``TrajectoriesConsumed`` when a trainer has claimed the rows this would replace.
    """
    build = get_builder(builder)
    rollout = session.get(Rollout, rollout_id, with_for_update=True)
    if rollout is None:
        raise NotFound(f"no rollout {rollout_id!r}", field="rollout_id")
    if options is None:
        options = task_builder_options(session, rollout.task_id)
    records = load_capture_records(session, rollout_id)
    result = build(records, roles=load_session_roles(session, rollout_id, records))
    traces: Sequence[Trace] = mark_scripted(result.traces, records)
    reward = outcome_reward if outcome_reward is not None else rollout.reward
    if trace_rewards is not None:
        traces = assign_trace_rewards(traces, trace_rewards, key=reward_key)
    elif reward is not None or options.reward is not RewardRouting.BROADCAST:
        role_rewards = _role_rewards(session, rollout_id) if options.reward is RewardRouting.PER_ROLE else None
        traces = route_rewards(traces, reward, options.reward, role_rewards)
    outcome = RolloutStatus(status if status is not None else rollout.status)
    if aligned_agent_timeout is None:
        aligned_agent_timeout = aligned_timeout_from_stage_results(rollout.results)
    unfinished = None if options.train_unfinished else result.stats.unfinished
    traces = apply_training_filter(
        traces, status=outcome, aligned_agent_timeout=aligned_agent_timeout, unfinished=unfinished
    )
    traces = select_roles(traces, options.train_roles)
    result = BuildResult(result.builder, tuple(traces), filtered_stats(result, traces))
    write_build(session, rollout_id=rollout_id, result=result, status=outcome)
    return result


def filtered_stats(built: BuildResult, traces: Sequence[Trace]) -> MergeStats:
    """``built``'s stats with the loss tokens that remain after the reward routing, the training filter and the
    role choice (``traces``) and, for every token those masked, its trace's reason (``filter_reason``)."""
    before = {trace.chain_index: trace.n_loss_tokens for trace in built.traces}
    untrained = dict(built.stats.untrained_tokens)
    for trace in traces:
        lost = before.get(trace.chain_index, 0) - trace.n_loss_tokens
        if lost > 0:
            reason = trace.filter_reason or "filtered"
            untrained[reason] = untrained.get(reason, 0) + lost
    return dataclasses.replace(
        built.stats,
        untrained_tokens=dict(sorted(untrained.items())),
        trainable_tokens=sum(trace.n_loss_tokens for trace in traces),
    )


def load_session_roles(
    session: Session, rollout_id: str, records: Sequence[CaptureRecord] | None = None
) -> SessionRoles:
    """The chain labels of ``rollout_id``: its calls' views and its harness's role hints."""
    if records is None:
        records = load_capture_records(session, rollout_id)
    return label_session(records, load_call_views(session, rollout_id), role_hints_for(session, rollout_id))


def task_builder_options(session: Session, task_id: str | None) -> BuilderOptions:
    """The task's ``builder_options`` (defaults for a task-less session)."""
    stored = session.scalar(sa.select(Task.builder_options).where(Task.id == task_id)) if task_id else None
    return BuilderOptions.model_validate(stored or {})


def _role_rewards(session: Session, rollout_id: str) -> Mapping[str, float] | None:
    """``details["role_rewards"]`` of the rollout's latest evaluation, if it gave one."""
    details = session.scalar(
        sa.select(Evaluation.details)
        .where(Evaluation.rollout_id == rollout_id)
        .order_by(Evaluation.created_at.desc(), Evaluation.id.desc())
        .limit(1)
    )
    rewards = (details or {}).get("role_rewards")
    if not isinstance(rewards, Mapping):
        return None
    return {str(k): float(v) for k, v in rewards.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def mark_scripted(traces: Sequence[Trace], records: Sequence[CaptureRecord]) -> list[Trace]:
    """Traces holding any capture of a scripted policy, marked ``scripted`` (the training filter zeroes them)."""
    scripted = {record.id for record in records if record.scripted}
    return [
        dataclasses.replace(trace, scripted=True) if scripted.intersection(trace.capture_ids) else trace
        for trace in traces
    ]


def write_build(session: Session, *, rollout_id: str, result: BuildResult, status: RolloutStatus | str) -> None:
    """Replace ``rollout_id``'s trajectories and merge stats for ``result.builder`` with ``result``."""
    owned = (Trajectory.rollout_id == rollout_id) & (Trajectory.builder == result.builder)
    claimed = session.scalar(sa.select(sa.func.count()).where(owned, Trajectory.consumed_by.is_not(None)))
    if claimed:
        raise TrajectoriesConsumed(
            f"rollout {rollout_id}: {claimed} {result.builder} trajectories were consumed by a trainer; "
            "not replacing them",
            field="rollout_id",
        )
    session.execute(sa.delete(Trajectory).where(owned))
    session.execute(sa.delete(MergeStat).where(MergeStat.rollout_id == rollout_id, MergeStat.builder == result.builder))
    if result.traces:
        session.execute(
            sa.insert(Trajectory), [_trajectory_row(rollout_id, result.builder, t, str(status)) for t in result.traces]
        )
    stats = result.stats
    session.add(
        MergeStat(
            rollout_id=rollout_id,
            builder=result.builder,
            captures_in=stats.captures_in,
            error_captures=stats.error_captures,
            traces_out=stats.traces_out,
            roots=stats.roots,
            exact_merges=stats.exact_merges,
            inexact_merges=stats.inexact_merges,
            breaks=stats.breaks,
            break_causes=dict(stats.break_causes),
            roots_by_role=dict(stats.roots_by_role),
            sampled_tokens=stats.sampled_tokens,
            loss_tokens=stats.loss_tokens,
            untrained_tokens=dict(stats.untrained_tokens),
            trainable_tokens=stats.trainable_tokens,
            root_causes=dict(stats.root_causes),
        )
    )
    session.flush()


def load_traces(session: Session, rollout_id: str, builder: str) -> list[Trace]:
    """The stored traces of ``rollout_id`` built by ``builder``, by chain index (logprobs come back as float32)."""
    rows = session.scalars(
        sa.select(Trajectory)
        .where(Trajectory.rollout_id == rollout_id, Trajectory.builder == builder)
        .order_by(Trajectory.chain_index)
    )
    return [
        Trace(
            chain_index=row.chain_index,
            capture_ids=tuple(row.capture_ids),
            prompt_ids=tuple(row.prompt_ids),
            response_ids=tuple(row.response_ids),
            loss_mask=tuple(row.loss_mask),
            response_logprobs=tuple(row.response_logprobs),
            version_spans=tuple(VersionRange.from_json(span) for span in row.version_spans),
            # NULL on rows built before revision 0020: no regime recorded (a rebuild records it).
            sampling_spans=tuple(SamplingRange.from_json(span) for span in row.sampling_spans or ()),
            weight_version_min=row.weight_version_min,
            weight_version_max=row.weight_version_max,
            finish_reason=row.finish_reason,
            n_inexact_merges=row.n_inexact_merges,
            n_malformed_tool_calls=row.n_malformed_tool_calls,
            scripted=row.scripted,
            reward=row.reward,
            filter_reason=row.filter_reason,
            role=row.role,
            source_capture_id=row.source_capture_id,
            compacted=row.compacted,
            kept=row.kept,
        )
        for row in rows
    ]


def _trajectory_row(rollout_id: str, builder: str, trace: Trace, status: str) -> dict[str, Any]:
    return {
        "rollout_id": rollout_id,
        "builder": builder,
        "chain_index": trace.chain_index,
        "capture_ids": list(trace.capture_ids),
        "prompt_ids": trace.prompt_ids,
        "response_ids": trace.response_ids,
        "loss_mask": trace.loss_mask,
        "response_logprobs": trace.response_logprobs,
        "reward": trace.reward,
        "weight_version_min": trace.weight_version_min,
        "weight_version_max": trace.weight_version_max,
        "version_spans": [span.as_json() for span in trace.version_spans],
        "sampling_spans": [span.as_json() for span in trace.sampling_spans],
        "turn_count": trace.turn_count,
        "n_prompt": len(trace.prompt_ids),
        "n_response": len(trace.response_ids),
        "n_loss_tokens": trace.n_loss_tokens,
        "status": status,
        "finish_reason": trace.finish_reason,
        "n_inexact_merges": trace.n_inexact_merges,
        "n_malformed_tool_calls": trace.n_malformed_tool_calls,
        "scripted": trace.scripted,
        "filter_reason": trace.filter_reason,
        "role": trace.role,
        "source_capture_id": trace.source_capture_id,
        "compacted": trace.compacted,
        "kept": trace.kept,
    }
