"""The ``polar harness`` and ``polar runtime`` subcommands: install agent CLIs, reap orphaned containers."""

from __future__ import annotations

import argparse

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
