"""Reward assignment, normalisation, and the fail-closed training filter."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError
from traj_helpers import EOT, RecordTree

from db.enums import RolloutStatus
from db.stage_results import StageResults
from polar.trajectory.per_request import per_request
from polar.trajectory.prefix_merge import prefix_merge
from polar.trajectory.records import Trace
from polar.trajectory.rewards import Normalization, RewardKey, assign_trace_rewards, broadcast_reward, normalize
from polar.trajectory.training_filter import (
    FilterReason,
    aligned_timeout_from_stage_results,
    apply_training_filter,
)

SYSTEM = [1, 50, EOT, 1, 60]


def _branching() -> tuple[RecordTree, list[Trace]]:
    """root -> a -> b, root -> c (malformed tool call in c): two merged traces."""
    tree = RecordTree()
    root = tree.add(SYSTEM, [10, EOT])
    a = tree.add([*tree.sequence(root), 70], [11, EOT], root)
    tree.add([*tree.sequence(a), 71], [12, EOT], a)
    tree.add([*tree.sequence(root), 72], [13, EOT], root, n_malformed_tool_calls=1)
    return tree, list(prefix_merge(tree.records).traces)


def _trace(reward: float | None, *, trainable: bool = True, index: int = 0) -> Trace:
    return Trace(index, (index + 1,), (1,), (5,), (int(trainable),), (-0.1,), reward=reward)


# §1 assignment


def test_outcome_reward_is_broadcast_to_every_trace() -> None:
    _, traces = _branching()
    assert [t.reward for t in broadcast_reward(traces, 1)] == [1.0, 1.0]
    assert [t.reward for t in traces] == [None, None]  # inputs are never changed


def test_per_trace_rewards_by_capture_take_the_entry_nearest_the_leaf() -> None:
    tree, traces = _branching()
    root, a, b, c = (r.id for r in tree.records)
    # The root's reward reaches every chain through it; a deeper capture's reward wins on its chain.
    rewarded = assign_trace_rewards(traces, {root: 0.1, b: 0.9})
    assert [t.reward for t in rewarded] == [0.9, 0.1]
    by_chain = assign_trace_rewards(traces, {0: 0.3, 1: 0.7}, key=RewardKey.CHAIN)
    assert [t.reward for t in by_chain] == [0.3, 0.7]


def test_per_trace_rewards_must_match_the_traces() -> None:
    tree, traces = _branching()
    b = tree.records[2].id
    with pytest.raises(ValueError, match="no reward for trace 1"):
        assign_trace_rewards(traces, {b: 1.0})
    assert [t.reward for t in assign_trace_rewards(traces, {b: 1.0}, default=0.0)] == [1.0, 0.0]
    with pytest.raises(ValueError, match="in no trace: \\[99\\]"):
        assign_trace_rewards(traces, {b: 1.0, 99: 1.0}, default=0.0)
    with pytest.raises(ValueError, match="in no trace: \\[5\\]"):
        assign_trace_rewards(traces, {0: 1.0, 1: 1.0, 5: 0.0}, key=RewardKey.CHAIN)


# §2 normalisation


def test_group_normalisation_counts_every_rollout_once() -> None:
    # Rollout "long" made 4 per-request traces, "short" 1: GRPO over rollouts, not over traces.
    groups = {
        "long": [_trace(1.0, index=i) for i in range(4)],
        "short": [_trace(0.0)],
        "failed": [_trace(0.0, trainable=False)],  # filtered: takes no part and is left alone
    }
    group = normalize(groups, Normalization.GROUP)
    assert [t.reward for t in group["long"]] == pytest.approx([1.0] * 4, abs=1e-5)
    assert [t.reward for t in group["short"]] == pytest.approx([-1.0], abs=1e-5)
    assert group["failed"][0].reward == 0.0

    # SESSION: each rollout's credit sums to its advantage, however many traces it was cut into.
    session = normalize(groups, Normalization.SESSION)
    assert sum(t.reward for t in session["long"]) == pytest.approx(1.0, abs=1e-5)
    assert session["short"][0].reward == pytest.approx(-1.0, abs=1e-5)

    assert normalize(groups, Normalization.NONE)["long"][0].reward == 1.0


def test_normalisation_of_identical_rewards_gives_zero_and_needs_every_reward() -> None:
    same = normalize({"a": [_trace(1.0)], "b": [_trace(1.0)]}, Normalization.GROUP)
    assert [t.reward for g in same.values() for t in g] == [0.0, 0.0]
    per_trace = normalize({"a": [_trace(1.0), _trace(0.0, index=1)]}, Normalization.GROUP)
    assert [t.reward for t in per_trace["a"]] == pytest.approx([1.0, -1.0], abs=1e-5)
    with pytest.raises(ValueError, match="no reward to normalise"):
        normalize({"a": [_trace(None)]}, Normalization.GROUP)


def test_broadcast_over_per_request_traces_with_session_normalisation() -> None:
    """The anchor's reward-hacking set-up, fixed: a 3-call success and a 1-call failure weigh the same."""
    win, lose = RecordTree(), RecordTree()
    root = win.add(SYSTEM, [10, EOT])
    child = win.add([*win.sequence(root), 70], [11, EOT], root)
    win.add([*win.sequence(child), 71], [12, EOT], child)
    lose.add(SYSTEM, [13, EOT])
    groups = {
        "win": broadcast_reward(per_request(win.records).traces, 1.0),
        "lose": broadcast_reward(per_request(lose.records).traces, 0.0),
    }
    advantages = normalize(groups, Normalization.SESSION)
    assert math.isclose(
        sum(t.reward for t in advantages["win"]), -sum(t.reward for t in advantages["lose"]), rel_tol=1e-5
    )


# §3 the fail-closed training filter


def test_completed_rollouts_train_but_malformed_tool_calls_get_no_reward() -> None:
    _, traces = _branching()
    filtered = apply_training_filter(broadcast_reward(traces, 1.0), status=RolloutStatus.COMPLETED)
    assert [(t.reward, t.filter_reason) for t in filtered] == [(1.0, None), (0.0, "malformed_tool_call")]
    assert [t.loss_mask for t in filtered] == [t.loss_mask for t in traces]
    # Before evaluation the reward stays unset, except where it is already known to be 0.
    pending = apply_training_filter(traces, status="COMPLETED")
    assert [t.reward for t in pending] == [None, 0.0]


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (RolloutStatus.ERROR, FilterReason.ROLLOUT_ERROR),
        (RolloutStatus.TIMEOUT, FilterReason.ROLLOUT_TIMEOUT),
        (RolloutStatus.CANCELLED, FilterReason.ROLLOUT_CANCELLED),
        (RolloutStatus.RUNNING, FilterReason.ROLLOUT_UNFINISHED),
    ],
)
def test_failed_and_unfinished_rollouts_are_zeroed(status, reason) -> None:
    _, traces = _branching()
    filtered = apply_training_filter(broadcast_reward(traces, 1.0), status=status)
    assert all(t.n_loss_tokens == 0 and t.reward == 0.0 and t.filter_reason == reason for t in filtered)
    assert [t.response_ids for t in filtered] == [t.response_ids for t in traces]  # kept for diagnosis


def test_an_aligned_agent_timeout_keeps_the_verifier_s_reward_and_its_mask() -> None:
    _, traces = _branching()
    kept = apply_training_filter(broadcast_reward(traces, 1.0), status="TIMEOUT", aligned_agent_timeout=True)
    assert [t.loss_mask for t in kept] == [t.loss_mask for t in traces]
    assert all(t.reward == 1.0 and t.filter_reason == "agent_timeout" for t in kept)
    # Not scored yet (no verifier reward): a negative.
    unscored = apply_training_filter(traces, status="TIMEOUT", aligned_agent_timeout=True)
    assert all(t.reward == 0.0 for t in unscored)
    # The flag only excuses a timeout.
    errored = apply_training_filter(traces, status="ERROR", aligned_agent_timeout=True)
    assert all(t.n_loss_tokens == 0 for t in errored)


def test_aligned_timeout_is_read_from_stage_results() -> None:
    run = {"outcome": "TIMEOUT", "agent_budget_expired": True, "exit_code": -1}
    assert aligned_timeout_from_stage_results(StageResults.of({"run": run}))
    assert not aligned_timeout_from_stage_results(StageResults.of({"run": {**run, "agent_budget_expired": False}}))
    assert not aligned_timeout_from_stage_results(StageResults.of({}))
    assert not aligned_timeout_from_stage_results(StageResults.of(None))
    # A malformed record is refused, not read as "no expiry" or coerced ("yes" is not true).
    for malformed in ({"run": {**run, "agent_budget_expired": "yes"}}, {"run": "timeout"}):
        with pytest.raises(ValidationError):
            StageResults.of(malformed)
