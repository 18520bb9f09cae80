"""What ``polar run`` reports when nothing is scored: tasks whose verifier crashes end ERROR, a tripped circuit
breaker still prints the batch's table (what ran, what failed, what was cancelled) before its error, the mean reward
of no scored rollout is "-", task names are never cut so that two tasks look alike, and the command fails (exit 1;
2 with the breaker's error, as every error the CLI names)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# Two names alike in their first 28 characters: cut short, the table would show one task twice.
PREFIX = "a-task-name-longer-than-the-old-column-"


def broken_task(index: int) -> dict[str, object]:
    return {
        "name": f"{PREFIX}{index}",
        "instruction": "Do nothing.",
        "harness": {"name": "command", "config": {"command": "true"}},
        "evaluator": {"type": "script", "config": {"script": "echo verifier crashed >&2; exit 2"}},
    }


def run(tmp_path: Path, cache_dir: Path, tasks: int, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "tasks.json").write_text(json.dumps([broken_task(i) for i in range(tasks)]))
    return polar(tmp_path, cache_dir, "run", str(tmp_path / "tasks.json"), **env)


def polar(tmp_path: Path, cache_dir: Path, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("POLAR_", "PREFECT_"))}
    environment |= {"POLAR_HOME": str(tmp_path / "home"), "POLAR_CACHE": str(cache_dir), "POLAR_EVALUATE_RETRIES": "0"}
    return subprocess.run(
        [str(Path(sys.executable).parent / "polar"), *argv],
        env=environment | env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_run_with_nothing_scored_exits_1_and_says_so(tmp_path, cache_dir):
    done = run(tmp_path, cache_dir, 2)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 rollouts: ERROR 2; mean reward - (0 solved)" in done.stdout, done.stdout
    assert f"{PREFIX}0 " in done.stdout and f"{PREFIX}1 " in done.stdout, done.stdout
    assert "every rollout ended ERROR: nothing was scored" in done.stderr
    # docs/cli.md's next steps on that store: retry the failed rollouts (the verifier still crashes), then see what
    # the builds hold.
    again = polar(tmp_path, cache_dir, "retry", "--stale-after", "600")
    assert again.returncode == 0 and "retried 2 rollouts" in again.stdout, again.stdout + again.stderr[-3000:]
    stats = polar(tmp_path, cache_dir, "trajectories", "stats")
    assert stats.returncode == 0, stats.stdout + stats.stderr[-3000:]


def test_a_tripped_breaker_prints_the_table_before_its_error(tmp_path, cache_dir):
    done = run(tmp_path, cache_dir, 6, POLAR_BATCH_MAX_CONSECUTIVE_ERRORS="2", POLAR_BATCH_MAX_ACTIVE="1")
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert "batch stopped after" in done.stdout, done.stdout
    assert "6 rollouts: CANCELLED 4, ERROR 2; mean reward - (0 solved)" in done.stdout, done.stdout
    assert "batch stopped: 2 rollouts in a row failed" in done.stderr, done.stderr[-3000:]
