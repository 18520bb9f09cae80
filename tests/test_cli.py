"""The ``polar`` command as a user runs it: migrations, one generation, the embedded demo."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from db.migrate import head
from polar.cli import main


def run_polar(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "polar.cli", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def polar_env(tmp_path: Path, cache_dir: Path) -> dict[str, str]:
    return {"POLAR_HOME": str(tmp_path / "home"), "POLAR_CACHE": str(cache_dir)}


def test_db_upgrade_current_downgrade(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    assert main(["db", "upgrade", "--url", url]) == 0
    assert head() in capsys.readouterr().out
    assert main(["db", "downgrade", "base", "--url", url]) == 0
    assert main(["db", "current", "--url", url]) == 0
    assert capsys.readouterr().out.strip().endswith("base")


def test_generate_prints_ids_and_logprobs(polar_env, tiny_model_dir):
    proc = run_polar("generate", "Hello there", "--max-new-tokens", "8", env=polar_env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["backend"] == "local" and len(out["output_ids"]) == len(out["output_logprobs"]) <= 8
    assert out["weight_version"] == "default" and out["finish_reason"] in ("stop", "length")


def test_demo_runs_toy_tasks_through_the_pipeline_then_trajectories_rebuild(polar_env, tiny_model_dir):
    """``polar demo`` on a fresh POLAR_HOME: Prefect's ephemeral mode, SQLite, the local runtime, no servers."""
    proc = run_polar("demo", "--samples", "2", env=polar_env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "6 rollouts: COMPLETED 6; mean reward 0.50 (3 solved); 13 captures -> 6 trajectories" in out
    table = [line for line in out.splitlines() if re.match(r"^[\w-]+ +\d+ [0-9a-f]{8} ", line)]
    assert len(table) == 6 and all(" COMPLETED " in line for line in table) and "changed calc.py" in out
    assert "rollouts: pending" in out  # progress lines
    assert (Path(polar_env["POLAR_HOME"]) / "polar.db").exists()
    assert f"POLAR_HOME={polar_env['POLAR_HOME']} polar serve" in out and "/ui" in out  # where to look at them

    proc = run_polar("trajectories", "rebuild", "--builder", "per_request", "--since", "2000-01-01", env=polar_env)
    assert proc.returncode == 0, proc.stderr
    assert "per_request: rebuilt 6 rollouts (13 captures -> 13 trajectories)" in proc.stdout
    proc = run_polar("trajectories", "rebuild", "--builder", "nope", "--since", "2000-01-01", env=polar_env)
    assert proc.returncode == 2 and "nope" in proc.stderr
    proc = run_polar("status", env=polar_env)
    assert proc.returncode == 0 and "6 rollouts: COMPLETED 6" in proc.stdout


def test_errors_are_reported_without_a_traceback(polar_env):
    proc = run_polar("generate", "hi", env={**polar_env, "POLAR_BACKEND": "sglang"})
    assert proc.returncode == 2
    assert "POLAR_BACKEND_URL is required for the sglang backend" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_polar("generate", "hi", env={**polar_env, "POLAR_MODEL": "huge"})
    assert proc.returncode == 2 and "unknown local model 'huge'" in proc.stderr
    proc = run_polar("generate", "hi", env={**polar_env, "POLAR_BACKEND": "tgi"})
    assert proc.returncode == 2 and "invalid setting POLAR_BACKEND" in proc.stderr and "Traceback" not in proc.stderr
