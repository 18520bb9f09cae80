"""The maintenance subcommands: ``polar db`` (Alembic migrations), ``polar harness`` (install agent CLIs),
``polar runtime`` (reap orphaned containers) and ``polar verify`` (re-feed stored captures and the trajectories a
trainer reads to a backend, ``polar.trajectory.verify``)."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from polar.settings import get_settings
from polar.trajectory.liveness import SAME_LOGPROB_TOLERANCE


def _db(args: argparse.Namespace) -> None:
    from db import migrate

    url = args.url or get_settings().resolved_database_url
    if args.action == "upgrade":
        migrate.upgrade(url, args.revision or "head")
        print(f"database at {url} is at {migrate.current(url)}")
    elif args.action == "downgrade":
        migrate.downgrade(url, args.revision or "base")
        print(f"database at {url} is at {migrate.current(url) or 'base'}")
    else:
        print(migrate.current(url) or "base")


def _harness(args: argparse.Namespace) -> None:
    from harness_adapters.install import TOOLS, install_tool

    settings = get_settings()
    names = sorted(TOOLS) if args.name == "all" else [args.name]
    for name in names:
        print(install_tool(name, settings.tools_dir, force=args.force).summary())


def _runtime(args: argparse.Namespace) -> None:
    from polar.runtime.reaper import reap_orphans

    settings = get_settings()
    removed = reap_orphans(docker_host=settings.docker_host, max_age_s=args.max_age)
    for item in removed:
        print(f"removed {item.name}: {item.reason}")
    print(f"{len(removed)} orphaned container(s) removed")


def _verify(args: argparse.Namespace) -> None:
    """Print one line per rollout (ok, FAIL or not checked) with every finding under it, then a JSON summary;
    exit 1 when a rollout fails (a named gap, token mismatch, routing difference or trajectory row that is not
    what its captures give). Usage and configuration errors (an unknown rollout or task, a negative tolerance, a
    backend that cannot be built) are ``PolarError``s: exit 2."""
    from db import session_scope
    from polar.backends.registry import make_backend
    from polar.errors import InvalidRequest
    from polar.rollout.context import store_factory
    from polar.settings import BackendKind
    from polar.trajectory.verify import load_captures, select_rollouts, summary, verify_rollout
    from polar.trajectory.verify_rows import check_stored

    if args.tolerance < 0:
        raise InvalidRequest(f"--tolerance must be 0 or more, not {args.tolerance}", field="tolerance")
    overrides: dict[str, object] = {"backend_url": args.backend_url} if args.backend_url else {}
    if args.backend:
        overrides["backend"] = BackendKind(args.backend)
    if args.url:
        overrides["database_url"] = args.url
    settings = get_settings().model_copy(update=overrides) if overrides else get_settings()
    factory = store_factory(settings)  # migrated: a fresh POLAR_HOME has nothing to check, not no tables
    limit = args.limit if args.limit is not None or args.rollout or args.task else 20
    loaded: dict[str, tuple[list[Any], list[Any]]] = {}
    with session_scope(factory) as db:
        for rollout_id in select_rollouts(db, rollout_id=args.rollout, task_id=args.task, limit=limit):
            captures = load_captures(db, rollout_id)
            loaded[rollout_id] = (captures, check_stored(db, rollout_id, captures, args.tolerance))
            for row in captures:
                db.expunge(row)

    async def main() -> list[Any]:
        backend = await make_backend(settings)
        try:
            return [
                await verify_rollout(backend, rollout_id, captures, rows, tolerance=args.tolerance)
                for rollout_id, (captures, rows) in loaded.items()
            ]
        finally:
            await backend.aclose()

    checks = asyncio.run(main())
    for check in checks:
        print(check.line())
        for problem in check.problems():
            print(f"  {problem}")
    totals = summary(checks, args.tolerance)
    print(json.dumps(totals))
    if totals["failed"]:
        raise SystemExit(1)


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from harness_adapters.install import TOOLS

    db = sub.add_parser("db", help="database migrations")
    db.add_argument("action", choices=["upgrade", "downgrade", "current"])
    db.add_argument("revision", nargs="?")
    db.add_argument("--url", help="database URL (default: POLAR_DATABASE_URL or the SQLite file in POLAR_HOME)")
    db.set_defaults(func=_db)

    harness = sub.add_parser("harness", help="install an agent CLI (pinned) into the tools folder (POLAR_TOOLS)")
    harness.add_argument("action", choices=["install"])
    harness.add_argument("name", choices=[*sorted(TOOLS), "all"])
    harness.add_argument("--force", action="store_true", help="reinstall even if installed")
    harness.set_defaults(func=_harness)

    runtime = sub.add_parser("runtime", help="runtime maintenance: remove orphaned Docker containers")
    runtime.add_argument("action", choices=["reap"])
    runtime.add_argument("--max-age", type=float, help="also remove containers older than this many seconds")
    runtime.set_defaults(func=_runtime)

    verify = sub.add_parser(
        "verify",
        help="re-feed stored captures and trajectories to the backend; exit 1 on any named gap or mismatch",
    )
    verify.add_argument("--rollout", help="one rollout (session) id")
    verify.add_argument("--task", help="the rollouts of one task (a batch)")
    verify.add_argument(
        "--limit", type=int, help="the most recent N rollouts with captures (default 20); with --task, its first N"
    )
    verify.add_argument(
        "--tolerance", type=float, default=SAME_LOGPROB_TOLERANCE, help="largest logprob gap that passes"
    )
    verify.add_argument("--backend", choices=["local", "sglang", "vllm"], help="override POLAR_BACKEND")
    verify.add_argument("--backend-url", help="override POLAR_BACKEND_URL")
    verify.add_argument("--url", help="database URL (default: POLAR_DATABASE_URL)")
    verify.set_defaults(func=_verify)
