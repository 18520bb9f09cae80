"""Logging of a ``polar`` process, configured once by the command line (``polar.cli``), never by the library.

Library modules only make loggers named after themselves (``logging.getLogger(__name__)``). ``configure``
gives the project's top-level loggers (``polar``, ``flows``, ``db``, ``harness_adapters``) one stderr handler at
``POLAR_LOG_LEVEL``, as text or as one JSON object a line (``POLAR_LOG_FORMAT=json``: ``time``, ``level``,
``logger``, ``message`` and whatever a call passed as ``extra``), and stops them from propagating, so a line
is written once even where Prefect has put its own console handler on the root logger. Calling it again
changes nothing.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

from pythonjsonlogger.json import JsonFormatter

from polar.settings import Settings

PROJECT_LOGGERS = ("polar", "flows", "db", "harness_adapters")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _PolarHandler(logging.StreamHandler[TextIO]):
    """The handler ``configure`` installs (its type tells a second call that the work is done)."""


def formatter(log_format: str) -> logging.Formatter:
    if log_format == "json":
        return JsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        )
    return logging.Formatter(TEXT_FORMAT)


def configure(settings: Settings) -> None:
    """Send the project's log lines to stderr as ``settings`` says (idempotent)."""
    handler = _PolarHandler(sys.stderr)
    handler.setFormatter(formatter(settings.log_format))
    for name in PROJECT_LOGGERS:
        logger = logging.getLogger(name)
        if any(isinstance(h, _PolarHandler) for h in logger.handlers):
            continue
        logger.addHandler(handler)
        logger.setLevel(settings.log_level)
        logger.propagate = False
