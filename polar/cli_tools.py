"""The ``polar harness``, ``polar runtime`` and ``polar verify`` subcommands: install agent CLIs, reap orphaned
containers, re-feed stored captures to a backend (``polar.trajectory.verify``)."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from polar.settings import get_settings


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
    """Print one line per rollout and a JSON summary; exit 1 when a rollout fails (gap or token mismatch)."""
    from db import make_engine, make_session_factory, session_scope
    from polar.backends.registry import make_backend
    from polar.settings import BackendKind
    from polar.trajectory.verify import load_captures, select_rollouts, summary, verify_rollout

    overrides: dict[str, object] = {"backend_url": args.backend_url} if args.backend_url else {}
    if args.backend:
        overrides["backend"] = BackendKind(args.backend)
    settings = get_settings().model_copy(update=overrides) if overrides else get_settings()
    factory = make_session_factory(make_engine(args.url or settings.resolved_database_url))
    with session_scope(factory) as db:
        selected = select_rollouts(db, rollout_id=args.rollout, task_id=args.task, limit=args.limit)
        captures = {rollout_id: load_captures(db, rollout_id) for rollout_id in selected}
        for rows in captures.values():
            for row in rows:
                db.expunge(row)

    async def main() -> list[Any]:
        backend = await make_backend(settings)
        try:
            return [await verify_rollout(backend, rollout_id, rows) for rollout_id, rows in captures.items()]
        finally:
            await backend.aclose()

    checks = asyncio.run(main())
    for check in checks:
        print(check.line(args.tolerance))
        for problem in check.mismatches + check.unchecked:
            print(f"  {problem}")
    totals = summary(checks, args.tolerance)
    print(json.dumps(totals))
    if totals["failed"]:
        raise SystemExit(1)


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from harness_adapters.install import TOOLS

    harness = sub.add_parser("harness", help="install an agent CLI (pinned) into the tools folder (POLAR_TOOLS)")
    harness.add_argument("action", choices=["install"])
    harness.add_argument("name", choices=[*sorted(TOOLS), "all"])
    harness.add_argument("--force", action="store_true", help="reinstall even if installed")
    harness.set_defaults(func=_harness)

    runtime = sub.add_parser("runtime", help="runtime maintenance: remove orphaned Docker containers")
    runtime.add_argument("action", choices=["reap"])
    runtime.add_argument("--max-age", type=float, help="also remove containers older than this many seconds")
    runtime.set_defaults(func=_runtime)

    verify = sub.add_parser("verify", help="re-feed stored captures to the backend: logprob gaps, token mismatches")
    verify.add_argument("--rollout", help="one rollout (session) id")
    verify.add_argument("--task", help="the rollouts of one task (a batch)")
    verify.add_argument("--limit", type=int, default=20, help="the most recent N rollouts (default 20)")
    verify.add_argument("--tolerance", type=float, default=1e-5, help="largest logprob gap that passes")
    verify.add_argument("--backend", choices=["local", "sglang", "vllm"], help="override POLAR_BACKEND")
    verify.add_argument("--backend-url", help="override POLAR_BACKEND_URL")
    verify.add_argument("--url", help="database URL (default: POLAR_DATABASE_URL)")
    verify.set_defaults(func=_verify)
