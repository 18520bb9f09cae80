"""Prepare actions: make a runtime ready before the harness starts (or a fresh evaluation runtime).

Actions run in order. Each retries on its own: up to ``max_attempts`` tries, waiting ``retry_backoff_s`` ×
attempt between them, so one flaky step (a download, a package index) costs a retry of that step, not of the
whole stage. A command's timeout is also capped by the shared deadline. The report lists every action with its
attempts; an action that fails on its last attempt raises ``PrepareFailed`` naming it.

A ``copy`` action reads the host, so its source must lie inside one of ``copy_roots`` (``POLAR_COPY_ROOTS``, plus
the folder of the tasks file for ``polar run``), symlinks resolved; by default there are none and a task can
copy nothing from the host. A source outside them fails the action at once (no retries: retrying cannot help).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from db.stage_reports import PrepareReport
from polar.errors import PrepareFailed, SandboxError
from polar.rollout.spec import PrepareAction
from polar.runtime.base import Runtime


class DeadlinePassed(Exception):
    """The shared deadline ran out while preparing; the rollout is a TIMEOUT, not a failure to retry."""


def allowed_source(source: str, roots: Sequence[Path]) -> Path:
    """``source`` resolved, if it is inside one of ``roots``; raises ``PrepareFailed`` otherwise."""
    resolved = Path(source).expanduser().resolve()
    for root in roots:
        base = Path(root).expanduser().resolve()
        if resolved == base or base in resolved.parents:
            return resolved
    allowed = ", ".join(str(r) for r in roots) or "none are configured"
    raise PrepareFailed(
        f"copy source {source!r} is outside the folders tasks may copy from (POLAR_COPY_ROOTS: {allowed})",
        field="source",
    )


async def _attempt(runtime: Runtime, action: PrepareAction, timeout_s: float) -> tuple[bool, str]:
    if action.type == "write_file":
        await runtime.write_file(action.path or "", action.content or "", executable=action.executable)
        return True, ""
    if action.type == "copy":
        await runtime.upload(Path(action.source or ""), action.path or "")
        return True, ""
    result = await runtime.exec(action.command or "", env=action.env, timeout_s=timeout_s)
    if result.timed_out:
        return False, f"timed out after {timeout_s:g} s"
    if not result.ok:
        return False, f"exit code {result.returncode}: {(result.stderr or result.stdout)[-300:].strip()}"
    return True, ""


async def run_prepare(
    runtime: Runtime,
    actions: Sequence[PrepareAction],
    *,
    copy_roots: Sequence[Path],
    remaining_s: Callable[[], float] | None = None,
) -> list[PrepareReport]:
    """Run ``actions`` in ``runtime``; returns one report per action. Raises ``PrepareFailed`` or ``DeadlinePassed``."""
    reports: list[PrepareReport] = []
    for index, action in enumerate(actions):
        if action.type == "copy":
            try:
                allowed_source(action.source or "", copy_roots)
            except PrepareFailed as exc:
                raise PrepareFailed(
                    f"prepare action {index}: {exc.message}", field=f"runtime.prepare.{index}"
                ) from None
        started = time.monotonic()
        errors: list[str] = []
        for attempt in range(1, action.max_attempts + 1):
            left = remaining_s() if remaining_s is not None else float("inf")
            if left <= 0:
                raise DeadlinePassed(f"the deadline passed before prepare action {index} ({action.label()})")
            try:
                ok, error = await _attempt(runtime, action, min(action.timeout_s, left))
            except SandboxError as exc:
                ok, error = False, exc.message
            if ok:
                break
            errors.append(error)
            if attempt < action.max_attempts:
                await asyncio.sleep(action.retry_backoff_s * attempt)
        else:
            raise PrepareFailed(
                f"prepare action {index} ({action.label()!r}) failed {action.max_attempts} time(s); last: {errors[-1]}",
                field=f"runtime.prepare.{index}",
            )
        reports.append(
            PrepareReport(
                action=index,
                type=action.type,
                attempts=attempt,
                errors=errors,
                duration_s=round(time.monotonic() - started, 3),
            )
        )
    return reports
