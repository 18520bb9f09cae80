"""Training trajectories rebuilt from a rollout's captures.

Builders are pure functions over ``CaptureRecord``s that return ``Trace``s and ``MergeStats``; reach them by
name through ``BUILDERS`` / ``get_builder`` (``per_request``, ``prefix_merge``), or import them from their
modules (the package does not re-export them, so ``polar.trajectory.prefix_merge`` stays the module). Around
them: reward assignment and group/session normalisation (``rewards``), the fail-closed training filter
(``training_filter``), storage in the ``trajectories`` and ``merge_stats`` tables (``store``), ``rebuild`` of
stored trajectories with another builder (the per-harness summary is ``polar.report.merges``). Modules:

- ``records``: the frozen records; ``tree``: the capture tree over records;
- ``per_request``, ``prefix_merge``: the builders; ``registry``: ``BUILDERS`` and ``get_builder``;
- ``roles``: chain roles (main, sub_agent, compaction, title, other) and their links, from ``call_views``;
- ``rewards``, ``training_filter``, ``choices``: what trains and with which reward (``choices``: per-task
  builder options: roles that train, reward routing to sub-agent and post-compaction chains);
- ``store``, ``rebuild``: the database side (generated sessions for tests and benchmarks are in
  ``tests/trajectory/synthetic.py``).
"""

from polar.trajectory.choices import BuilderOptions, RewardRouting
from polar.trajectory.prefix_merge import BreakCause, detect_end_of_turn
from polar.trajectory.rebuild import RebuildReport, RolloutRebuild, rebuild
from polar.trajectory.records import (
    PLACEHOLDER_LOGPROB,
    BuildResult,
    CaptureRecord,
    MergeStats,
    Trace,
    VersionRange,
)
from polar.trajectory.registry import BUILDERS, Builder, get_builder
from polar.trajectory.rewards import Normalization, RewardKey, assign_trace_rewards, broadcast_reward, normalize
from polar.trajectory.roles import ChainLabel, Role, RoleHints, SessionRoles, label_session
from polar.trajectory.store import (
    TrajectoriesConsumed,
    build_and_store,
    load_capture_records,
    load_traces,
    write_build,
)
from polar.trajectory.training_filter import (
    AGENT_BUDGET_EXPIRED,
    FilterReason,
    aligned_timeout_from_stage_results,
    apply_training_filter,
)

__all__ = [
    "AGENT_BUDGET_EXPIRED",
    "BUILDERS",
    "PLACEHOLDER_LOGPROB",
    "BreakCause",
    "BuildResult",
    "Builder",
    "BuilderOptions",
    "ChainLabel",
    "CaptureRecord",
    "FilterReason",
    "MergeStats",
    "Normalization",
    "RebuildReport",
    "RewardKey",
    "RewardRouting",
    "Role",
    "RoleHints",
    "RolloutRebuild",
    "SessionRoles",
    "Trace",
    "TrajectoriesConsumed",
    "VersionRange",
    "aligned_timeout_from_stage_results",
    "apply_training_filter",
    "assign_trace_rewards",
    "broadcast_reward",
    "build_and_store",
    "detect_end_of_turn",
    "get_builder",
    "label_session",
    "load_capture_records",
    "load_traces",
    "normalize",
    "rebuild",
    "write_build",
]
