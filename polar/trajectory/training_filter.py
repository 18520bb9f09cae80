"""The fail-closed training filter: which traces of a rollout may train, and with what reward.

Only a COMPLETED rollout trains as evaluated. Any other status (ERROR, TIMEOUT, CANCELLED, or a rollout not
finished yet, whose outcome is unknown) zeroes every trace's loss mask and reward: the traces stay in the store
for diagnosis but cannot move the policy. One exception, as in the anchor: a TIMEOUT where the agent's own
budget ran out during the run, cleanly (``aligned_agent_timeout``), keeps its traces trainable with the reward
the verifier gave the state the agent left (Harbor's rule; 0 when there is none): their tokens and logprobs are
aligned by construction, and the model did spend the budget. A verifier or infrastructure timeout is never
trainable. Independently, a trace holding a tool call the gateway
could not parse gets reward 0 even in a COMPLETED rollout, so malformed calls are never rewarded. A trace that
holds a capture made by a scripted policy (tests, demos: replies no model sampled) never trains: its loss mask is
zeroed whatever the outcome (its reward is kept, for SFT exports that ask for scripted conversations). A
COMPLETED rollout whose session is ``unfinished`` (its last main call has no clean answer:
``polar.trajectory.liveness.Unfinished``) has no kept chain for its outcome reward: every trace's mask is zeroed
with that reason, unless the task's builder options say ``train_unfinished``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from enum import StrEnum

from db.enums import RolloutStatus
from db.stage_results import StageResults
from polar.trajectory.records import Trace

AGENT_BUDGET_EXPIRED = "agent_budget_expired"
"""Key in ``rollouts.stage_results["run"]`` that the run stage sets to ``true`` when the harness was stopped
because the agent budget ran out (not the session deadline, not a crash)."""


class FilterReason(StrEnum):
    """Why the filter changed a trace (``trajectories.filter_reason``)."""

    ROLLOUT_ERROR = "rollout_error"  # mask and reward zeroed
    ROLLOUT_TIMEOUT = "rollout_timeout"  # mask and reward zeroed
    ROLLOUT_CANCELLED = "rollout_cancelled"  # mask and reward zeroed
    ROLLOUT_UNFINISHED = "rollout_unfinished"  # mask and reward zeroed: the outcome is not known yet
    AGENT_TIMEOUT = "agent_timeout"  # kept trainable, with the verifier's reward (0 without one)
    MALFORMED_TOOL_CALL = "malformed_tool_call"  # reward 0, mask kept
    SCRIPTED = "scripted"  # mask zeroed: a scripted policy wrote the reply, no model sampled it


_ZEROED = {
    RolloutStatus.ERROR: FilterReason.ROLLOUT_ERROR,
    RolloutStatus.TIMEOUT: FilterReason.ROLLOUT_TIMEOUT,
    RolloutStatus.CANCELLED: FilterReason.ROLLOUT_CANCELLED,
}


def aligned_timeout_from_stage_results(results: StageResults) -> bool:
    """Whether the run stage reported an agent-budget expiry (``RunResult.agent_budget_expired``)."""
    return results.run is not None and results.run.agent_budget_expired


def apply_training_filter(
    traces: Sequence[Trace],
    *,
    status: RolloutStatus | str,
    aligned_agent_timeout: bool = False,
    unfinished: str | None = None,
) -> list[Trace]:
    """``traces`` of one rollout whose outcome is ``status``, masked and rewarded fail-closed (module docstring).
    ``unfinished``: why the session's last main call has no clean answer (``MergeStats.unfinished``), if so.

    A trace that keeps its mask and has no reward yet keeps ``reward=None`` (to be assigned after evaluation),
    unless it is a negative or holds a malformed tool call, which get 0.
    """
    judged = _by_outcome(traces, status=status, aligned_agent_timeout=aligned_agent_timeout)
    if unfinished is not None and RolloutStatus(status) is RolloutStatus.COMPLETED:
        judged = [_with(trace, reward=trace.reward, reason=unfinished, zero_mask=True) for trace in judged]
    return [_scripted(trace) if trace.scripted else trace for trace in judged]


def _scripted(trace: Trace) -> Trace:
    """Loss mask zeroed, reward kept (an SFT export that asks for scripted conversations filters on it); the
    outcome's reason stays when the outcome had zeroed the trace already."""
    zeroed = trace.filter_reason is not None and not any(trace.loss_mask)
    reason = FilterReason(trace.filter_reason) if zeroed and trace.filter_reason else FilterReason.SCRIPTED
    return _with(trace, reward=trace.reward, reason=reason, zero_mask=True)


def _by_outcome(
    traces: Sequence[Trace], *, status: RolloutStatus | str, aligned_agent_timeout: bool = False
) -> list[Trace]:
    status = RolloutStatus(status)
    if status is RolloutStatus.TIMEOUT and aligned_agent_timeout:
        return [
            _with(trace, reward=trace.reward if trace.reward is not None else 0.0, reason=FilterReason.AGENT_TIMEOUT)
            for trace in traces
        ]
    if status is not RolloutStatus.COMPLETED:
        reason = _ZEROED.get(status, FilterReason.ROLLOUT_UNFINISHED)
        return [_with(trace, reward=0.0, reason=reason, zero_mask=True) for trace in traces]
    return [
        _with(trace, reward=0.0, reason=FilterReason.MALFORMED_TOOL_CALL) if trace.n_malformed_tool_calls else trace
        for trace in traces
    ]


def _with(trace: Trace, *, reward: float | None, reason: str, zero_mask: bool = False) -> Trace:
    mask = (0,) * len(trace.loss_mask) if zero_mask else trace.loss_mask
    return dataclasses.replace(trace, reward=reward, loss_mask=mask, filter_reason=str(reason))
