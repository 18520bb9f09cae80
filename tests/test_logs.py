"""The polar command's logging: text or one JSON object a line, at the configured level, written once."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys

import pytest

from polar import logs
from tests.rollout.helpers import test_settings


@pytest.fixture
def restored():
    """configure() changes process-wide loggers: put them back for the tests that follow."""
    saved = {n: (lg.handlers[:], lg.level, lg.propagate) for n in logs.PROJECT_LOGGERS if (lg := logging.getLogger(n))}
    yield
    for name, (handlers, level, propagate) in saved.items():
        logger = logging.getLogger(name)
        logger.handlers[:], logger.level, logger.propagate = handlers, level, propagate


def test_json_lines_carry_level_logger_message_and_extras(tmp_path, monkeypatch, restored):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    settings = test_settings(tmp_path, tmp_path, "sqlite://", log_format="json", log_level="WARNING")
    logs.configure(settings)
    logs.configure(settings)  # a second call adds nothing
    # Loggers of their own: a module's logger may have been disabled by an earlier dictConfig in this process.
    logging.getLogger("polar.logs_probe").info("not at this level")
    logging.getLogger("polar.logs_probe").warning("stage %s failed", "run", extra={"rollout_id": "r1"})
    logging.getLogger("flows.logs_probe").error("taken over")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(x["level"], x["logger"], x["message"]) for x in lines] == [
        ("WARNING", "polar.logs_probe", "stage run failed"),
        ("ERROR", "flows.logs_probe", "taken over"),
    ]
    assert lines[0]["rollout_id"] == "r1" and "time" in lines[0]


def test_the_polar_command_configures_logging_from_the_environment(tmp_path):
    """A real ``polar`` process: an invalid level is refused by name, a valid one is accepted."""
    env = {"POLAR_HOME": str(tmp_path), "POLAR_LOG_LEVEL": "LOUD", "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-m", "polar.cli", "db", "current", "--url", f"sqlite:///{tmp_path / 'p.db'}"]
    bad = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "POLAR_LOG_LEVEL" in bad.stderr
    good = subprocess.run(cmd, env={**env, "POLAR_LOG_LEVEL": "ERROR"}, capture_output=True, text=True, timeout=120)
    assert good.returncode == 0, good.stderr
