"""Training choices per task (``TaskRequest.builder_options``): which chain roles train, and how the rollout's
reward reaches sub-agent and post-compaction trajectories (issue 16).

- ``train_roles``: roles whose trajectories keep their loss mask; default ``main`` and ``sub_agent``. Title
  calls and compaction summaries train only when named here; the others stay stored with a zeroed mask and
  ``filter_reason = "role_not_trained"``.
- ``reward``: ``broadcast`` (every trajectory gets the outcome reward), ``main_only`` (only ``main``
  trajectories that do not start from a compaction summary get it; sub-agent and post-compaction
  trajectories get no reward and do not train: ``reward_not_routed``), or ``per_role`` (the evaluator's
  ``details["role_rewards"]``, keyed by role, with ``post_compaction`` for compacted chains; a trajectory
  whose key is missing does not train, fail-closed).
- ``train_unfinished``: off by default, so a session whose last main call has no clean answer trains nothing
  (``polar.trajectory.training_filter``); on, its kept chain up to the last clean call trains with the outcome.

Pre- and post-compaction chains are always separate samples: the builders cut a compaction call from the
chain it summarises and start the post-compaction chain from the summary it was given, so no merge ever
pretends the summary was seen where it was not. That is not an option.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from polar.trajectory.records import Trace
from polar.trajectory.roles import Role

POST_COMPACTION = "post_compaction"
"""The ``role_rewards`` key of chains that start from a compaction summary (``Trace.compacted``)."""


class RewardRouting(StrEnum):
    BROADCAST = "broadcast"
    MAIN_ONLY = "main_only"
    PER_ROLE = "per_role"


class ChoiceReason(StrEnum):
    """``trajectories.filter_reason`` values set here (mask zeroed)."""

    ROLE_NOT_TRAINED = "role_not_trained"
    REWARD_NOT_ROUTED = "reward_not_routed"


class BuilderOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    train_roles: tuple[Role, ...] = Field(
        default=(Role.MAIN, Role.SUB_AGENT), description="chain roles that train; title and compaction only when named"
    )
    reward: RewardRouting = Field(default=RewardRouting.BROADCAST, description="how the outcome reward reaches chains")
    train_unfinished: bool = Field(
        default=False,
        description="train a session whose last main call has no clean answer (poisoned, ambiguous, failed or "
        "unread, no retry answering it): its kept chain up to the last clean call gets the outcome reward",
    )


def reward_key(trace: Trace) -> str:
    """The ``role_rewards`` key of ``trace``: ``post_compaction`` for a compacted chain, else its role."""
    return POST_COMPACTION if trace.compacted else trace.role


def route_rewards(
    traces: Sequence[Trace],
    outcome: float | None,
    routing: RewardRouting,
    role_rewards: Mapping[str, float] | None = None,
) -> list[Trace]:
    """Rewards on ``traces`` by ``routing``; a trace the reward does not reach is marked, mask zeroed."""
    out: list[Trace] = []
    for trace in traces:
        if routing is RewardRouting.BROADCAST:
            out.append(trace if outcome is None else dataclasses.replace(trace, reward=float(outcome)))
        elif routing is RewardRouting.MAIN_ONLY:
            reached = trace.role == Role.MAIN.value and not trace.compacted
            out.append(dataclasses.replace(trace, reward=outcome) if reached else _unrouted(trace))
        else:
            key = reward_key(trace)
            if role_rewards is not None and key in role_rewards:
                out.append(dataclasses.replace(trace, reward=float(role_rewards[key])))
            else:
                out.append(_unrouted(trace))
    return out


def select_roles(traces: Sequence[Trace], train_roles: Sequence[Role]) -> list[Trace]:
    """``traces`` with the mask zeroed on roles that do not train (an earlier filter reason is kept)."""
    keep = {Role(role).value for role in train_roles}
    return [
        trace
        if trace.role in keep
        else dataclasses.replace(
            trace,
            loss_mask=(0,) * len(trace.loss_mask),
            filter_reason=trace.filter_reason or ChoiceReason.ROLE_NOT_TRAINED.value,
        )
        for trace in traces
    ]


def _unrouted(trace: Trace) -> Trace:
    return dataclasses.replace(
        trace, reward=None, loss_mask=(0,) * len(trace.loss_mask), filter_reason=ChoiceReason.REWARD_NOT_ROUTED.value
    )
