"""The ``polar`` command: one parser, each subcommand a thin shell over a library function, mounted from the modules
of this package by what they do; ``main`` runs one in this process and turns its errors into exit codes."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from pydantic import ValidationError

from polar.cli import data, generate, models, runs, servers, tasks, tools
from polar.errors import PolarError
from polar.logs import configure as configure_logging
from polar.settings import get_settings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="polar", description="Polar: token-faithful rollouts for real agent harnesses"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    tools.add_parsers(sub)  # db, harness, runtime, verify
    servers.add_parsers(sub)  # serve-model, gateway, serve
    generate.add_parsers(sub)
    runs.add_parsers(sub)  # demo, run, retry
    data.add_parsers(sub)  # status, trajectories, export, report
    models.add_parsers(sub)  # model init, model fetch
    tasks.add_parsers(sub)  # tasks import, tasks check
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
