"""``polar demo``, ``polar run`` and ``polar retry``: batches through the Prefect flows in this process, each inside
one Prefect temporary server; ``batch`` is also how ``polar tasks check`` runs its oracles and no-ops."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from polar.settings import get_settings

if TYPE_CHECKING:
    from polar.report.rollouts import RolloutRow
    from polar.settings import Settings


def allow_copy_root(path: Path) -> None:
    """Let this process's tasks read ``path`` (build contexts, copied files): added to ``POLAR_COPY_ROOTS``."""
    own = str(Path(path).resolve())
    roots = [r for r in os.environ.get("POLAR_COPY_ROOTS", "").split(",") if r]
    os.environ["POLAR_COPY_ROOTS"] = ",".join([*roots, own] if own not in roots else roots)
    get_settings.cache_clear()


def harness_spec(name: str, config: str | None, model: str | None) -> dict[str, Any]:
    """The ``harness`` of a TaskRequest from the ``--harness``, ``--harness-config`` (JSON) and ``--model`` flags."""
    spec: dict[str, Any] = {"name": name, "config": json.loads(config) if config else {}}
    if model:
        spec["model"] = model
    return spec


def batch(settings: Settings, tasks: Sequence[dict[str, Any]], title: str) -> list[RolloutRow] | None:
    """A batch through the Prefect batch flow in this process, inside one Prefect temporary server (``polar run``,
    ``polar tasks check``): its rows, or None when some rollout was not taken to its end here."""
    from flows.demo import run_batch
    from flows.prefect_server import temporary_server
    from polar.rollout.context import close_contexts

    async def main() -> list[RolloutRow] | None:
        try:
            run = await run_batch(settings, tasks, title=title)
        finally:
            await asyncio.to_thread(close_contexts)
        return None if run.not_run else run.rows

    with temporary_server(settings):
        return asyncio.run(main())


def _demo(args: argparse.Namespace) -> None:
    from flows.prefect_server import temporary_server

    settings = get_settings()
    with temporary_server(settings):
        from flows.demo import run_demo

        asyncio.run(run_demo(settings, samples=args.samples, real_samples=args.real_samples))


def _run(args: argparse.Namespace) -> None:
    from polar.tasks import load_tasks

    harness = harness_spec(args.harness, args.harness_config, args.model) if args.harness else None
    tasks = load_tasks(args.tasks, harness=harness, samples=args.samples)
    # The tasks' own folder is a copy root for this run: its tasks may copy (and build) the files that come with them.
    source = Path(args.tasks)
    allow_copy_root(source if source.is_dir() else source.resolve().parent)
    rows = batch(get_settings(), tasks, f"polar run: {len(tasks)} task(s) from {args.tasks}")
    if rows is None:  # a rollout this run did not take to its end is not a success (the lines above say why)
        raise SystemExit(1)
    if rows and all(r.status == "ERROR" for r in rows):  # nothing was scored: the run failed, whatever it printed
        print("every rollout ended ERROR: nothing was scored (the notes above give each cause)", file=sys.stderr)
        raise SystemExit(1)


def _retry(args: argparse.Namespace) -> None:
    from flows.prefect_server import temporary_server
    from polar.rollout.context import close_contexts

    settings = get_settings()

    async def main() -> dict[str, Any]:
        try:
            return await retry_failed(
                rollout_ids=args.rollout or None,
                task_id=args.task,
                include_stale=not args.failed_only,
                stale_after_s=args.stale_after,
            )
        finally:
            await asyncio.to_thread(close_contexts)

    with temporary_server(settings):
        from flows.retry import retry_failed

        result = asyncio.run(main())
    print(f"retried {len(result['retried'])} rollouts: {result['counts']}")


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser(
        "demo", help="the embedded main job: toy tasks, then a real model's, through the whole pipeline (no servers)"
    )
    demo.add_argument("--samples", type=int, default=4, help="samples per toy task")
    demo.add_argument(
        "--real-samples", type=int, default=4, help="samples per question of the real model's part (0: skip it)"
    )
    demo.set_defaults(func=_demo)

    run = sub.add_parser("run", help="run TaskRequests (a JSON file) or Harbor task folders in this process")
    run.add_argument("tasks", help="a JSON file (one TaskRequest or a list), or a Harbor task folder or folder of them")
    run.add_argument("--samples", type=int, help="samples per task (overrides num_samples)")
    run.add_argument("--harness", help="the harness of Harbor/SWE-bench tasks (default: mini_swe_agent)")
    run.add_argument("--harness-config", help="the harness's config as JSON")
    run.add_argument("--model", help="the model name the harness asks for")
    run.set_defaults(func=_run)

    retry = sub.add_parser("retry", help="resume failed rollouts and take over stale ones")
    retry.add_argument("--rollout", action="append", help="a rollout id (repeatable); default: all failed")
    retry.add_argument("--task", help="only this task's rollouts")
    retry.add_argument("--failed-only", action="store_true", help="leave unfinished (stale) rollouts alone")
    retry.add_argument("--stale-after", type=float, help="seconds without a heartbeat (default POLAR_STALE_AFTER_S)")
    retry.set_defaults(func=_retry)
