"""Top-k logprobs and routed experts of trainer samples, fetched from the control API when a trainer asks.

``sample_extras`` returns, per sample, its merged trajectory's ``TrajectoryExtras`` (``polar.trajectory.extras``):
top-k ids and logprobs per completion token (``top_mask`` 1 on sampled tokens) and routed experts (tokens,
layers, k) for every prompt and completion token, or None where the sample has no trajectory or its session did
not capture them. The adapters (TRL, verl) turn them into their own fields; slime reads the same arrays
(``rollout_routed_experts`` is (tokens - 1, layers, k): drop the last row).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from polar.client import PolarClient
from polar.integrations.groups import Sample
from polar.trajectory.extras import TrajectoryExtras, extras_from_json


def sample_extras(client: PolarClient, samples: Sequence[Sample]) -> list[TrajectoryExtras | None]:
    """One control-API read per sample that has a trajectory."""
    out: list[TrajectoryExtras | None] = []
    for sample in samples:
        if sample.trajectory_id is None:
            out.append(None)
            continue
        extras = extras_from_json(client.trajectory_extras(sample.trajectory_id))
        out.append(extras if extras.any else None)
    return out


def trl_fields(samples: Sequence[Sample], extras: Sequence[TrajectoryExtras | None]) -> dict[str, list[Any]]:
    """Extra ``rollout_func`` fields (TRL forwards them to reward functions and custom losses), aligned with
    ``completion_ids``: ``polar_top_ids`` / ``polar_top_logprobs`` (lists of k per token, empty lists where the
    token was not sampled) and ``polar_routed_experts`` (a (prompt + completion, layers, k) array) or None."""
    top_ids: list[Any] = []
    top_logprobs: list[Any] = []
    experts: list[Any] = []
    for sample, extra in zip(samples, extras, strict=True):
        n = len(sample.completion_ids)
        if extra is not None and extra.top_ids is not None and extra.top_mask is not None and len(extra.top_ids) == n:
            assert extra.top_logprobs is not None
            top_ids.append([row.tolist() if m else [] for row, m in zip(extra.top_ids, extra.top_mask, strict=True)])
            top_logprobs.append(
                [row.tolist() if m else [] for row, m in zip(extra.top_logprobs, extra.top_mask, strict=True)]
            )
        else:
            top_ids.append(None)
            top_logprobs.append(None)
        routed = extra.routed_experts if extra is not None else None
        experts.append(routed if routed is not None and len(routed) == len(sample.prompt_ids) + n else None)
    return {"polar_top_ids": top_ids, "polar_top_logprobs": top_logprobs, "polar_routed_experts": experts}
