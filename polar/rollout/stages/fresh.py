"""The fresh evaluation runtime: a second runtime, prepared like the agent's (or with the evaluator's own
``prepare``), in which the evaluator grades the agent's changes without anything else the agent left behind.
The run stage prepares it while the agent works; the evaluate stage prepares it if that did not happen (or
happened on another machine), then applies the agent's diff and copies ``copy_paths`` into it.
"""

from __future__ import annotations

from typing import Any

from polar.errors import SandboxError
from polar.rollout.context import RolloutContext
from polar.rollout.prepare import run_prepare
from polar.rollout.stages.common import agent_runtime, eval_runtime
from polar.rollout.state import RolloutView
from polar.runtime.base import Runtime


async def prepare_eval_runtime(ctx: RolloutContext, view: RolloutView) -> dict[str, Any]:
    runtime = eval_runtime(ctx, view)
    await runtime.start(fresh=True)
    spec = view.task.evaluator
    actions = spec.prepare if spec.prepare is not None else view.task.runtime.prepare
    reports = await run_prepare(runtime, actions, copy_roots=ctx.settings.copy_root_paths)
    # The marker says the recipe finished: a runtime half-prepared by a dead attempt is prepared again.
    await runtime.write_file(str(runtime.layout.private / "prepared"), "ok")
    return {"runtime": runtime.describe(), "prepare": reports}


async def fresh_eval_runtime(
    ctx: RolloutContext, view: RolloutView, artifacts: dict[str, Any]
) -> tuple[Runtime, dict[str, Any]]:
    """The prepared evaluation runtime with the agent's changes applied."""
    runtime = eval_runtime(ctx, view)
    report: dict[str, Any] = {"reused": runtime.exists() and (runtime.layout.private / "prepared").exists()}
    if not report["reused"]:
        report.update(await prepare_eval_runtime(ctx, view))
    else:
        await runtime.start(fresh=False)
    patch = artifacts.get("patch_file")
    if patch and artifacts.get("diff_bytes"):
        await runtime.upload(patch, str(runtime.layout.private / "agent.patch"))
        applied = await runtime.exec(
            f"git apply --binary --whitespace=nowarn {runtime.layout.private / 'agent.patch'}", timeout_s=120
        )
        if not applied.ok:
            raise SandboxError(f"the agent's diff does not apply in the fresh runtime: {applied.stderr[-300:].strip()}")
        report["applied_diff"] = True
    source = agent_runtime(ctx, view)
    for path in view.task.evaluator.copy_paths:
        if (source.layout.work / path).exists():
            await runtime.upload(source.layout.work / path, path)
    report["copied"] = list(view.task.evaluator.copy_paths)
    return runtime, report
