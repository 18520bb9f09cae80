"""The fresh evaluation runtime: a second runtime, prepared like the agent's (or with the evaluator's own
``prepare``), in which the evaluator grades the agent's changes without anything else the agent left behind.
The run stage prepares it while the agent works; the evaluate stage prepares it if that did not happen (or
happened on another machine), then applies the agent's diff and copies ``copy_paths`` into it.

On a host without the agent's runtime folder (the rollout resumed elsewhere) the diff and the ``copy_paths``
come from the artifacts the run kept (``artifact_store``), and ``rebuild_agent_runtime`` recreates the agent's
runtime for an evaluator that grades it in place: prepared like the agent's, its changes applied. A needed
artifact that was not kept fails the stage naming it (``ArtifactMissing``), never a grade of untouched files.
"""

from __future__ import annotations

import asyncio

from db.stage_reports import ArtifactSummary, RuntimeReport
from polar.errors import ArtifactMissing, SandboxError
from polar.rollout import artifact_store
from polar.rollout.context import RolloutContext
from polar.rollout.prepare import run_prepare
from polar.rollout.stages.common import agent_runtime, eval_runtime
from polar.rollout.state import RolloutView
from polar.runtime.base import Runtime


async def prepare_eval_runtime(ctx: RolloutContext, view: RolloutView) -> RuntimeReport:
    runtime = eval_runtime(ctx, view)
    await runtime.start(fresh=True)
    spec = view.task.evaluator
    actions = spec.prepare if spec.prepare is not None else view.task.runtime.prepare
    reports = await run_prepare(runtime, actions, copy_roots=ctx.settings.copy_root_paths)
    # The marker says the recipe finished: a runtime half-prepared by a dead attempt is prepared again.
    await runtime.write_file(str(runtime.layout.private / "prepared"), "ok")
    return RuntimeReport(runtime=runtime.describe(), prepare=reports)


async def fresh_eval_runtime(
    ctx: RolloutContext, view: RolloutView, artifacts: ArtifactSummary
) -> tuple[Runtime, RuntimeReport]:
    """The prepared evaluation runtime with the agent's changes applied."""
    runtime = eval_runtime(ctx, view)
    report = RuntimeReport(reused=runtime.exists() and (runtime.layout.private / "prepared").exists())
    if not report.reused:
        report = report.merged(await prepare_eval_runtime(ctx, view))
    else:
        await runtime.start(fresh=False)
    changes = await _apply_changes(ctx, view, runtime, artifacts, local=agent_runtime(ctx, view).exists())
    return runtime, report.merged(changes)


def _kept(view: RolloutView, artifacts: ArtifactSummary) -> ArtifactSummary:
    if not artifacts.kept:
        raise ArtifactMissing(
            f"rollout {view.id}: its runtime folder is not on this host and its run kept no artifacts"
            f" ({artifacts.error or 'none were recorded'})",
            field="artifacts",
        )
    return artifacts


async def _stored(ctx: RolloutContext, view: RolloutView, kept: ArtifactSummary, name: str) -> bytes:
    entry = kept.entry(name)
    why = (entry.reason or "") if not entry.stored else ""
    return await asyncio.to_thread(artifact_store.load, ctx.factory, view.id, name, why=why)


async def _apply_patch(runtime: Runtime, patch: bytes) -> None:
    target = runtime.layout.private / "agent.patch"
    await runtime.write_file(str(target), patch)
    applied = await runtime.exec(f"git apply --binary --whitespace=nowarn {target}", timeout_s=120)
    if not applied.ok:
        raise SandboxError(f"the agent's diff does not apply in the fresh runtime: {applied.stderr[-300:].strip()}")


async def _apply_changes(
    ctx: RolloutContext, view: RolloutView, runtime: Runtime, artifacts: ArtifactSummary, *, local: bool
) -> RuntimeReport:
    """The agent's diff and the evaluator's ``copy_paths``, from the agent's runtime folder when this host has it
    (``local``), else from the kept artifacts."""
    applied_diff = restored_work = False
    source = agent_runtime(ctx, view)
    kept = ArtifactSummary() if local else _kept(view, artifacts)
    if artifacts.diff_bytes:
        if local and artifacts.patch_file:
            with open(artifacts.patch_file, "rb") as f:
                patch = f.read()
        else:
            patch = await _stored(ctx, view, kept, "diff.patch")
        await _apply_patch(runtime, patch)
        applied_diff = True
    elif not local and "work.tar.gz" in kept.kept:
        data = await _stored(ctx, view, kept, "work.tar.gz")
        await asyncio.to_thread(artifact_store.untar_into, data, runtime.layout.work)
        restored_work = True
    for path in view.task.evaluator.copy_paths:
        if local:
            if (source.layout.work / path).exists():
                await runtime.upload(source.layout.work / path, path)
            continue
        if kept.entry(f"work/{path}").absent:
            continue
        if f"work/{path}.tar.gz" in kept.kept:
            data = await _stored(ctx, view, kept, f"work/{path}.tar.gz")
            await asyncio.to_thread(artifact_store.untar_into, data, runtime.layout.work / path)
        else:
            await runtime.write_file(path, await _stored(ctx, view, kept, f"work/{path}"))
    copied, from_artifacts = list(view.task.evaluator.copy_paths), not local
    if applied_diff:  # the report names what was done, and only that
        return RuntimeReport(applied_diff=True, copied=copied, from_artifacts=from_artifacts)
    if restored_work:
        return RuntimeReport(restored_work=True, copied=copied, from_artifacts=from_artifacts)
    return RuntimeReport(copied=copied, from_artifacts=from_artifacts)


async def rebuild_agent_runtime(ctx: RolloutContext, view: RolloutView, artifacts: ArtifactSummary) -> RuntimeReport:
    """The agent's runtime recreated on this host (its folder is elsewhere): prepared like the agent's, then the
    agent's changes applied from the kept artifacts."""
    _kept(view, artifacts)  # fail before preparing anything when nothing was kept
    runtime = agent_runtime(ctx, view)
    await runtime.start(fresh=True)
    reports = await run_prepare(runtime, view.task.runtime.prepare, copy_roots=ctx.settings.copy_root_paths)
    changes = await _apply_changes(ctx, view, runtime, artifacts, local=False)
    return RuntimeReport(rebuilt=True, prepare=reports).merged(changes)
