"""The rollout pipeline without Prefect: tasks in, rewarded trajectories out.

- ``spec``: ``TaskRequest`` and its specs, ``parse_task_request`` (errors name the field);
- ``submit``: ``submit_tasks`` stores a task and one rollout row per sample;
- ``stages``: ``init``, ``run``, ``postrun``, ``evaluate`` (plain async functions recording their results and
  timings in the rollout row, so a retried rollout resumes at the stage that failed);
- ``state``: the row bookkeeping (claim, stage begin/finish, failure, retry selection);
- ``pipeline``: ``drive_rollout`` runs one rollout through the stages under ``limits`` (stage concurrency and
  the READY buffer); ``context``: what a process shares (store, gateway, judge model);
- ``prepare``, ``artifacts``, ``gateway_client``: prepare actions with retries, the git diff, the session API.

``flows/`` wraps this in Prefect: each rollout a flow run whose four task runs are these stages.
"""

from polar.rollout.context import (
    RolloutContext,
    close_contexts,
    get_context,
    get_store,
    rollout_context,
    store_factory,
)
from polar.rollout.limits import (
    Limiter,
    NoLimits,
    ProcessLimiter,
    process_limiter,
    stage_limits,
)
from polar.rollout.pipeline import (
    RolloutSummary,
    StageCall,
    direct_call,
    drive_rollout,
    drive_rollouts,
)
from polar.rollout.spec import (
    EvaluatorSpec,
    HarnessSpec,
    PrepareAction,
    RuntimeSpec,
    TaskRequest,
    parse_task_request,
)
from polar.rollout.stages import (
    STAGE_FUNCTIONS,
    StageReport,
    evaluate,
    init,
    postrun,
    run,
)
from polar.rollout.state import STAGES, RolloutView, Stage, StageOutput
from polar.rollout.submit import (
    SubmittedTask,
    dispatch_order,
    submit_tasks,
    validate_tasks,
)

__all__ = [
    "STAGES",
    "STAGE_FUNCTIONS",
    "EvaluatorSpec",
    "HarnessSpec",
    "Limiter",
    "NoLimits",
    "PrepareAction",
    "ProcessLimiter",
    "RolloutContext",
    "RolloutSummary",
    "RolloutView",
    "RuntimeSpec",
    "Stage",
    "StageCall",
    "StageOutput",
    "StageReport",
    "SubmittedTask",
    "TaskRequest",
    "close_contexts",
    "direct_call",
    "dispatch_order",
    "drive_rollout",
    "drive_rollouts",
    "evaluate",
    "get_context",
    "get_store",
    "init",
    "parse_task_request",
    "postrun",
    "process_limiter",
    "rollout_context",
    "run",
    "stage_limits",
    "store_factory",
    "submit_tasks",
    "validate_tasks",
]
