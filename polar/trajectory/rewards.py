"""Rewards on traces: an outcome reward broadcast to a rollout's traces, per-trace rewards from an evaluator,
and normalisation over a group of rollouts.

Credit assignment depends on the builder. Under ``prefix_merge`` a session gives one trace per branch, so
broadcasting its outcome reward is the natural choice. Under ``per_request`` a session of 50 calls gives 50
traces with the same credit: long sessions outvote short ones, and the anchor saw reward hacking when it
trained that way without session normalisation. ``Normalization.SESSION`` is that normalisation: each
trace's group-normalised value is divided by its rollout's number of trainable traces, so a rollout's total
credit is its advantage however many traces it was cut into. Per-trace (process) rewards are the other way out.

Functions return new traces (``dataclasses.replace``). The store keeps raw rewards, after the training
filter; normalisation needs every rollout of a group (e.g. the samples of one task), so it is applied when a
trainer batch is assembled, and its values (advantages) are not written back.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from enum import StrEnum

from polar.trajectory.records import Trace


class RewardKey(StrEnum):
    """What the keys of a per-trace reward mapping name."""

    CAPTURE = "capture"  # a capture id: the reward of one model call
    CHAIN = "chain"  # a trace's chain_index


class Normalization(StrEnum):
    NONE = "none"
    # GRPO: (r - mean) / (std + eps) over the group, every rollout weighing the same however many traces it has.
    GROUP = "group"
    # GROUP, then divided by the rollout's number of trainable traces: each session's credit sums to its advantage.
    SESSION = "session"


def broadcast_reward(traces: Sequence[Trace], reward: float) -> list[Trace]:
    """Every trace of a rollout gets the rollout's outcome ``reward``."""
    return [dataclasses.replace(trace, reward=float(reward)) for trace in traces]


def assign_trace_rewards(
    traces: Sequence[Trace],
    rewards: Mapping[int, float],
    *,
    key: RewardKey = RewardKey.CAPTURE,
    default: float | None = None,
) -> list[Trace]:
    """Per-trace rewards from ``rewards``, keyed by capture id or by chain index.

    By capture id, a trace takes the reward of the last of its captures (leaf first) that has one, so a
    reward for one model call lands on every chain through it, nearest the leaf winning. A trace no key
    matches gets ``default``; without a default that is a ``ValueError``, not a silent zero (the anchor marks
    a rollout ERROR when trace rewards do not match its traces). Keys that match no trace are an error too.
    """
    out: list[Trace] = []
    used: set[int] = set()
    for trace in traces:
        keys = (trace.chain_index,) if key is RewardKey.CHAIN else tuple(reversed(trace.capture_ids))
        found = next((k for k in keys if k in rewards), None)
        if found is None:
            if default is None:
                raise ValueError(f"no reward for trace {trace.chain_index} (by {key.value}: {list(keys)})")
            reward = default
        else:
            used.add(found)
            reward = rewards[found]
        out.append(dataclasses.replace(trace, reward=float(reward)))
    if key is RewardKey.CHAIN:
        unused = set(rewards) - used
    else:
        unused = set(rewards) - {capture_id for trace in traces for capture_id in trace.capture_ids}
    if unused:
        raise ValueError(f"rewards given for {key.value} ids that are in no trace: {sorted(unused)}")
    return out


def normalize(
    groups: Mapping[str, Sequence[Trace]], method: Normalization, *, eps: float = 1e-6
) -> dict[str, list[Trace]]:
    """The traces of a group of rollouts (rollout id -> its traces) with normalised rewards.

    Only trainable traces (any loss token) take part and are changed; a filtered trace keeps its reward. Mean
    and (population) variance are over traces weighted by 1 / (trainable traces of their rollout), so every
    rollout counts once; with broadcast rewards this is exactly GRPO over the rollouts' outcome rewards, and
    per-trace rewards add their spread within a rollout. A trainable trace without a reward is a ``ValueError``.
    """
    if method is Normalization.NONE:
        return {rollout: list(traces) for rollout, traces in groups.items()}
    trainable = {rollout: [t for t in traces if t.n_loss_tokens > 0] for rollout, traces in groups.items()}
    weighted: list[tuple[float, float]] = []  # (weight, reward)
    for rollout, kept in trainable.items():
        for trace in kept:
            if trace.reward is None:
                raise ValueError(f"rollout {rollout}: trace {trace.chain_index} has no reward to normalise")
            weighted.append((1.0 / len(kept), trace.reward))
    total = sum(weight for weight, _ in weighted)
    mean = sum(weight * reward for weight, reward in weighted) / total if weighted else 0.0
    variance = sum(weight * (reward - mean) ** 2 for weight, reward in weighted) / total if weighted else 0.0
    scale = math.sqrt(variance) + eps
    out: dict[str, list[Trace]] = {}
    for rollout, traces in groups.items():
        share = 1.0 / len(trainable[rollout]) if method is Normalization.SESSION and trainable[rollout] else 1.0
        out[rollout] = [
            dataclasses.replace(trace, reward=(trace.reward - mean) / scale * share)  # type: ignore[operator]
            if trace.n_loss_tokens > 0
            else trace
            for trace in traces
        ]
    return out
