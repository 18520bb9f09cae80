"""The ``polar`` command line (docs/cli.md): ``main`` is the console script's entry point.

``entry`` builds the parser and runs a subcommand; the other modules each mount the subcommands of one job:
``tools`` (db, harness, runtime, verify), ``servers`` (serve-model, gateway, serve), ``generate``, ``runs`` (demo,
run, retry), ``data`` (status, trajectories, export, report), ``models`` (model) and ``tasks``.
This package is the one place that wires the Prefect flows into the library (the dependency rule,
docs/architecture.md).
"""

from polar.cli.entry import main

__all__ = ["main"]
