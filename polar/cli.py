"""The ``polar`` command. Each subcommand is a thin shell over a library function."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from polar.errors import PolarError
from polar.logs import configure as configure_logging
from polar.settings import get_settings

if TYPE_CHECKING:
    from polar.report.rollouts import RolloutRow
    from polar.settings import Settings


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


def _gateway(args: argparse.Namespace) -> None:
    from polar.models.command import use_model_path
    from polar.proxy.server import serve_gateway

    use_model_path(args.model_path)
    settings = get_settings()
    host, port = args.host or settings.gateway_host, args.port or settings.gateway_port
    if args.workers > 1:
        from polar.proxy.server import run_workers

        extra = ["--model-path", str(args.model_path)] if args.model_path else []
        raise SystemExit(run_workers(settings, host, port, args.workers, extra))
    import uvloop  # the gateway's loop: bench_gateway_scale measures it against asyncio's

    uvloop.run(serve_gateway(settings, host, port, reuse_port=args.reuse_port))


def _generate(args: argparse.Namespace) -> None:
    from polar.generate import generate_reply

    print(
        json.dumps(
            asyncio.run(generate_reply(get_settings(), args.prompt, args.max_new_tokens, args.temperature)), indent=1
        )
    )


def _demo(args: argparse.Namespace) -> None:
    from flows.prefect_server import temporary_server

    settings = get_settings()
    with temporary_server(settings):
        from flows.demo import run_demo

        asyncio.run(run_demo(settings, samples=args.samples, real_samples=args.real_samples))


def _run(args: argparse.Namespace) -> None:
    from polar.tasks import load_tasks
    from polar.tasks.command import allow_copy_root, harness_spec

    harness = harness_spec(args.harness, args.harness_config, args.model) if args.harness else None
    tasks = load_tasks(args.tasks, harness=harness, samples=args.samples)
    # The tasks' own folder is a copy root for this run: its tasks may copy (and build) the files that come with them.
    source = Path(args.tasks)
    allow_copy_root(source if source.is_dir() else source.resolve().parent)
    rows = _batch(get_settings(), tasks, f"polar run: {len(tasks)} task(s) from {args.tasks}")
    if rows is None:  # a rollout this run did not take to its end is not a success (the lines above say why)
        raise SystemExit(1)
    if rows and all(r.status == "ERROR" for r in rows):  # nothing was scored: the run failed, whatever it printed
        print("every rollout ended ERROR: nothing was scored (the notes above give each cause)", file=sys.stderr)
        raise SystemExit(1)


def _batch(settings: Settings, tasks: Sequence[dict[str, Any]], title: str) -> list[RolloutRow] | None:
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


def _serve(args: argparse.Namespace) -> None:
    from flows.prefect_server import temporary_server
    from polar.api import serve
    from polar.models.check import checked_model
    from polar.models.command import use_model_path
    from polar.models.resolve import ModelChoice

    use_model_path(args.model_path)
    settings = get_settings()
    checked_model(ModelChoice.policy(settings))  # the policy model and its server agree, or nothing starts
    if settings.judge_url or settings.judge_model_path:
        checked_model(ModelChoice.judge(settings))
    with temporary_server(settings):  # before the first flow: one server, stopped when serving ends
        from flows.dispatch import run_inline
        from polar.proxy.embedded import start_embedded

        serve(host=args.host, port=args.port, run_inline=run_inline, start_gateway=start_embedded)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="polar", description="Polar: token-faithful rollouts for real agent harnesses"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    db = sub.add_parser("db", help="database migrations")
    db.add_argument("action", choices=["upgrade", "downgrade", "current"])
    db.add_argument("revision", nargs="?")
    db.add_argument("--url", help="database URL (default: POLAR_DATABASE_URL or the SQLite file in POLAR_HOME)")
    db.set_defaults(func=_db)

    from polar.serving import command as serve_model

    serve = sub.add_parser("serve-model", help="serve the local model with SGLang's /generate wire format")
    serve_model.add_arguments(serve)
    serve.set_defaults(func=serve_model.run)

    gateway = sub.add_parser("gateway", help="the model API gateway (OpenAI, Anthropic, Gemini protocols)")
    gateway.add_argument("--host", help="default: POLAR_GATEWAY_HOST (127.0.0.1)")
    gateway.add_argument("--port", type=int, help="default: POLAR_GATEWAY_PORT (8700)")
    gateway.add_argument("--model-path", type=Path, help="the model's Hugging Face folder (POLAR_MODEL_PATH)")
    gateway.add_argument("--workers", type=int, default=1, help="gateway processes sharing the port (default 1)")
    gateway.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)  # a worker of --workers
    gateway.set_defaults(func=_gateway)

    gen = sub.add_parser("generate", help="one chat turn through the configured backend, printed as JSON")
    gen.add_argument("prompt")
    gen.add_argument("--max-new-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=1.0)
    gen.set_defaults(func=_generate)

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

    api = sub.add_parser("serve", help="the control API: tasks, rollouts, trajectories, trainer claims, weights")
    api.add_argument("--host", help="default: POLAR_API_HOST (127.0.0.1)")
    api.add_argument("--port", type=int, help="default: POLAR_API_PORT (8800)")
    api.add_argument("--model-path", type=Path, help="the policy model's Hugging Face folder (POLAR_MODEL_PATH)")
    api.set_defaults(func=_serve)

    from polar import cli_data, cli_tools
    from polar.models import command as model_command
    from polar.tasks import command as tasks_command

    cli_data.add_parsers(sub)
    cli_tools.add_parsers(sub)
    model_command.add_parsers(sub)
    tasks_command.add_parsers(sub, _batch)
    return parser


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM unwinds like Ctrl-C: ``finally`` blocks and exit handlers run, so what this command started (Prefect's
    temporary server, the embedded gateway, harnesses) stops with it instead of being left behind."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    try:
        args = build_parser().parse_args(argv)
        if argv is None:  # the polar process itself (tests call main with arguments and keep pytest's logging)
            configure_logging(get_settings())
        args.func(args)
    except PolarError as exc:
        print(f"polar: error: {exc.message}", file=sys.stderr)
        return 2
    except ValidationError as exc:  # settings from the environment
        first = exc.errors()[0]
        name = "POLAR_" + "_".join(str(p) for p in first["loc"]).upper()
        print(f"polar: error: invalid setting {name}: {first['msg']}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("polar: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except BaseException as exc:
        # SIGTERM inside a Prefect flow run arrives as Prefect's TerminationSignal (it installs its own handler).
        signum = getattr(exc, "signal", None)
        if isinstance(exc, SystemExit) or not isinstance(signum, int):
            raise
        print(f"polar: stopped by signal {signum}", file=sys.stderr)
        return 128 + signum
    return 0


if __name__ == "__main__":
    sys.exit(main())
