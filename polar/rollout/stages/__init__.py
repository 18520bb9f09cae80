"""The four stages of a rollout as plain async functions (no Prefect): ``init``, ``run``, ``postrun``,
``evaluate``. Each takes the process's ``RolloutContext``, a rollout id and the owning flow run, records its
result and timings in the rollout row, and skips itself when it is already done (so a retried rollout resumes
at the stage that failed)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from polar.rollout.stages.common import StageReport
from polar.rollout.stages.evaluate import evaluate
from polar.rollout.stages.init import init
from polar.rollout.stages.postrun import postrun
from polar.rollout.stages.run import run
from polar.rollout.state import Stage

StageFunction = Callable[..., Awaitable[StageReport]]
"""``(ctx: RolloutContext, rollout_id: str, *, owner: str) -> StageReport``"""

STAGE_FUNCTIONS: dict[Stage, StageFunction] = {
    Stage.INIT: init,
    Stage.RUN: run,
    Stage.POSTRUN: postrun,
    Stage.EVALUATE: evaluate,
}

__all__ = ["STAGE_FUNCTIONS", "StageFunction", "StageReport", "evaluate", "init", "postrun", "run"]
