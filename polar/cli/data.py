"""The data subcommands: ``polar status`` (recent rollouts and the live summary), ``polar trajectories`` (rebuild,
stats), ``polar export`` and ``polar report``."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import threading
from datetime import UTC, datetime
from pathlib import Path

from polar.errors import InvalidRequest
from polar.settings import get_settings


def _status(args: argparse.Namespace) -> None:
    import sqlalchemy as sa

    from db.models import Task
    from polar.auth import control_token
    from polar.live import LiveView
    from polar.live.text import format_live
    from polar.report.rollouts import format_rollouts, format_totals, rollout_rows
    from polar.rollout.context import store_factory

    settings = get_settings()
    factory = store_factory(settings)
    view = LiveView(settings, factory, control_token(settings, create=False) or None)

    def screen() -> str:
        with factory() as db:
            task_ids = args.task or list(
                db.scalars(sa.select(Task.id).order_by(Task.created_at.desc()).limit(args.last))
            )
        rows = rollout_rows(factory, task_ids)
        live = format_live(asyncio.run(view.snapshot()))
        return "\n".join([format_rollouts(rows), format_totals(rows), "", live])

    if not args.watch:
        print(screen())
        return
    # One screen, redrawn; Ctrl-C ends it after the screen being drawn. Our own handler, not KeyboardInterrupt:
    # raised inside asyncio.run it cancels the snapshot, whose scrapes (gathered with return_exceptions) can
    # swallow the cancellation, and the loop went on drawing.
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.is_set():
        text = screen()
        print("\x1b[H\x1b[2J" + text, flush=True)
        stop.wait(args.watch)


def _trajectories(args: argparse.Namespace) -> None:
    from polar.rollout.context import store_factory
    from polar.trajectory import rebuild

    settings = get_settings()
    # Migrated: a fresh POLAR_HOME has no builds yet, not no tables.
    factory = store_factory(settings.model_copy(update={"database_url": args.url}) if args.url else settings)
    if args.action == "stats":  # the stored builds' token record: every untrained token with its reason
        from polar.report.merges import stored_token_lines

        with factory() as db:
            lines = stored_token_lines(db, rollout_id=args.rollout, task_id=args.task, builder=args.builder)
        print("\n".join(lines) or "no stored builds match")
        return
    since = datetime.fromisoformat(args.since) if args.since else None
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    builder = args.builder or "prefix_merge"
    report = rebuild(factory, builder=builder, rollout_id=args.rollout, task_id=args.task, since=since)
    print(report.summary())
    for done in report.rebuilt:  # every masked token with its reason
        print(f"  {done.rollout_id}: {done.stats.token_line()}")
    for rollout_id, reason in report.skipped:
        print(f"  skipped {rollout_id}: {reason}")
    for rollout_id, reason in report.failed:
        print(f"  failed {rollout_id}: {reason}")
    if report.failed:  # a script (or CI) must see that some rollouts kept their old rows or none
        raise SystemExit(1)


def _export(args: argparse.Namespace) -> None:
    from polar.export import Acceptance, ExportFilter, export
    from polar.rollout.context import store_factory

    settings = get_settings()
    filters = ExportFilter(
        task_ids=args.task,
        task_name=args.task_name,
        harness=args.harness,
        builder=args.builder,
        min_reward=args.min_reward,
        max_reward=args.max_reward,
        status=args.status,
        weight_version=args.version,
        since=_when(args.since),
        until=_when(args.until),
        roles=args.role,
        acceptance=(
            Acceptance(min_reward=args.min_reward or 1.0, include_scripted=args.include_scripted)
            if args.accepted
            else None
        ),
        include_scripted=args.include_scripted,
    )
    report = export(
        store_factory(settings), settings, Path(args.output), kind=args.kind, filters=filters, fmt=args.format
    )
    print(json.dumps({"path": str(report.path), "kind": report.kind.value, "rows": report.rows, "bytes": report.bytes}))


def _report(args: argparse.Namespace) -> None:
    from polar.report.build import build_report
    from polar.rollout.context import store_factory

    report = build_report(
        store_factory(get_settings()),
        Path(args.out),
        since=_when(args.since),
        until=_when(args.until),
        task_ids=args.task,
    )
    print(
        json.dumps(
            {
                "html": str(report.html),
                "images": {k: str(v) for k, v in report.images.items()},
                "charts": {k: str(v) for k, v in report.charts.items()},
                **report.summary,
            }
        )
    )


def _when(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidRequest(f"not an ISO date/time: {value!r}", field="since/until") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = sub.add_parser("status", help="the rollouts of recent tasks as a table")
    status.add_argument("--task", action="append", help="a task id (repeatable)")
    status.add_argument("--last", type=int, default=5, help="the last N tasks when no --task is given")
    status.add_argument(
        "--watch",
        type=float,
        nargs="?",
        const=2.0,
        default=None,
        metavar="SECONDS",
        help="redraw the screen every SECONDS (2 if not given) until Ctrl-C",
    )
    status.set_defaults(func=_status)

    traj = sub.add_parser("trajectories", help="rebuild trajectories from captures, or show their token record")
    traj.add_argument("action", choices=["rebuild", "stats"])
    traj.add_argument("--builder", help="per_request or prefix_merge (rebuild: default prefix_merge; stats: all)")
    traj.add_argument("--rollout", help="one rollout id")
    traj.add_argument("--task", help="every rollout of a task")
    traj.add_argument("--since", help="every rollout created since an ISO date/time (UTC if no zone)")
    traj.add_argument("--url", help="database URL (default: the configured store)")
    traj.set_defaults(func=_trajectories)

    exp = sub.add_parser("export", help="trajectories as SFT conversations or RL token rows, JSONL or parquet")
    exp.add_argument("output", help="a .jsonl or .parquet path")
    exp.add_argument("--kind", choices=["sft", "rl"], default="rl")
    exp.add_argument("--format", choices=["jsonl", "parquet"], help="default: from the output's suffix")
    exp.add_argument("--task", action="append", help="a task id (repeatable)")
    exp.add_argument("--task-name")
    exp.add_argument("--harness")
    exp.add_argument("--builder", help="default: each task's own builder")
    exp.add_argument("--min-reward", type=float)
    exp.add_argument("--max-reward", type=float)
    exp.add_argument("--status", action="append", help="trajectory status (repeatable), e.g. COMPLETED")
    exp.add_argument("--version", help="sampled under this weight version")
    exp.add_argument("--since", help="created at or after this ISO date/time (UTC if no zone)")
    exp.add_argument("--until", help="created before this ISO date/time")
    exp.add_argument(
        "--role", action="append", help="chain role (repeatable): main, sub_agent, compaction, title, other"
    )
    exp.add_argument(
        "--accepted", action="store_true", help="SFT acceptance: reward >= --min-reward (1), no errors, not truncated"
    )
    exp.add_argument(
        "--include-scripted",
        action="store_true",
        help="also rows scripted policies wrote (tests, demos)",
    )
    exp.set_defaults(func=_export)

    rep = sub.add_parser("report", help="plots (PNG) and a self-contained HTML summary of a run or a date range")
    rep.add_argument("--out", default="polar-report", help="output folder")
    rep.add_argument("--task", action="append", help="a task id (repeatable)")
    rep.add_argument("--since")
    rep.add_argument("--until")
    rep.set_defaults(func=_report)
