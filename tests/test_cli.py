"""The ``polar`` command as a user runs it: migrations, one generation, the embedded demo."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
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


def test_the_read_commands_answer_on_a_fresh_home(polar_env):
    """What a new user may type first: on a POLAR_HOME with no store yet, the store is created and the reading
    commands say there is nothing, instead of a traceback about missing tables."""
    verify = run_polar("verify", env=polar_env)
    assert verify.returncode == 0 and '"rollouts": 0' in verify.stdout, verify.stdout + verify.stderr
    stats = run_polar("trajectories", "stats", env=polar_env)
    assert stats.returncode == 0 and "no stored builds match" in stats.stdout, stats.stdout + stats.stderr


def test_generate_prints_ids_and_logprobs(polar_env, tiny_model_dir):
    proc = run_polar("generate", "Hello there", "--max-new-tokens", "8", env=polar_env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["backend"] == "local" and len(out["output_ids"]) == len(out["output_logprobs"]) <= 8
    assert out["weight_version"] == "default" and out["finish_reason"] in ("stop", "length")


def test_demo_runs_toy_tasks_then_the_real_model_through_the_pipeline(polar_env, tiny_model_dir, smollm2_dir):
    """``polar demo`` on a fresh POLAR_HOME: Prefect's ephemeral mode, SQLite, the local runtime, no servers; no
    control token configured, so one is generated (0600) and passed internally, and never printed. The scripted
    batch on the tiny model, then the real part: SmolLM2 sampling its own answers, whose tokens are trainable."""
    models = Path(polar_env["POLAR_CACHE"]) / "models"
    models.mkdir(parents=True, exist_ok=True)
    if not (models / smollm2_dir.name).exists():  # the converted folder, as `polar model fetch` left it
        (models / smollm2_dir.name).symlink_to(smollm2_dir)
    argv = ("demo", "--samples", "2", "--real-samples", "2")
    proc = run_polar(*argv, env={**polar_env, "POLAR_CONTROL_TOKEN": ""}, timeout=420)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    token_file = Path(polar_env["POLAR_HOME"]) / "control-token"
    assert token_file.stat().st_mode & 0o777 == 0o600 and str(token_file) in proc.stderr
    assert token_file.read_text().strip() not in proc.stdout + proc.stderr
    out = proc.stdout
    assert "6 rollouts: COMPLETED 6; mean reward 0.50 (3 solved); 13 captures -> 6 trajectories, 0 trainable" in out
    table = [line for line in out.splitlines() if re.match(r"^[\w-]+ +\d+ [0-9a-f]{8} ", line)]
    assert len(table) == 10 and all(" COMPLETED " in line for line in table) and "changed calc.py" in out
    assert "rollouts: pending" in out  # progress lines
    real = re.search(
        r"^4 rollouts: COMPLETED 4; mean reward [\d.]+ \(\d solved\); 4 captures -> 4 trajectories, (\d+)", out, re.M
    )
    assert real and int(real.group(1)) > 0, out  # the real model's own samples train
    whole = re.search(r"^the whole demo: 10 rollouts: COMPLETED 10; .* (\d+) trainable tokens$", out, re.M)
    assert whole and int(whole.group(1)) == int(real.group(1)), out
    assert (Path(polar_env["POLAR_HOME"]) / "polar.db").exists()
    assert f"POLAR_HOME={polar_env['POLAR_HOME']} polar serve" in out and "/ui" in out  # where to look at them

    proc = run_polar("trajectories", "rebuild", "--builder", "per_request", "--since", "2000-01-01", env=polar_env)
    assert proc.returncode == 0, proc.stderr
    assert "per_request: rebuilt 10 rollouts (17 captures -> 17 trajectories)" in proc.stdout
    proc = run_polar("trajectories", "rebuild", "--builder", "nope", "--since", "2000-01-01", env=polar_env)
    assert proc.returncode == 2 and "nope" in proc.stderr
    proc = run_polar("status", env=polar_env)
    assert proc.returncode == 0 and "10 rollouts: COMPLETED 10" in proc.stdout


def test_errors_are_reported_without_a_traceback(polar_env):
    proc = run_polar("generate", "hi", env={**polar_env, "POLAR_BACKEND": "sglang"})
    assert proc.returncode == 2
    assert "POLAR_BACKEND_URL is required for the sglang backend" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_polar("generate", "hi", env={**polar_env, "POLAR_MODEL": "huge"})
    assert proc.returncode == 2 and "unknown local model 'huge'" in proc.stderr
    proc = run_polar("generate", "hi", env={**polar_env, "POLAR_BACKEND": "tgi"})
    assert proc.returncode == 2 and "invalid setting POLAR_BACKEND" in proc.stderr and "Traceback" not in proc.stderr


def _descendants(pid: int) -> dict[int, str]:
    """Live descendants of ``pid``: pid -> command line."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = {}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            try:
                found[child] = (Path(f"/proc/{child}") / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        return (Path(f"/proc/{pid}") / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_sigterm_stops_what_polar_run_started(polar_env, tmp_path, tiny_model_dir):
    """SIGTERM to ``polar run`` mid-batch: it exits, and Prefect's temporary server and the running harness, which
    it started, stop with it."""
    task = {
        "name": "long",
        "instruction": "Wait.",
        "harness": {"name": "agent", "config": {"max_turns": 4}},
        "evaluator": {"type": "command", "config": {"command": "true"}},
        "policies": [
            {
                "type": "scripted",
                "replies": [
                    {"content": "", "tool_calls": [{"name": "bash", "arguments": {"command": "sleep 300"}}]},
                    {"content": "Done."},
                ],
            }
        ],
    }
    (tmp_path / "tasks.json").write_text(json.dumps([task]))
    env = {**os.environ, **polar_env}
    env.pop("PREFECT_API_URL", None)  # Prefect's ephemeral mode: `polar run` starts a temporary server
    with (tmp_path / "run.log").open("w") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [sys.executable, "-m", "polar.cli", "run", str(tmp_path / "tasks.json")],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        started = _wait(
            lambda: (d := _descendants(proc.pid)) and any("polar-launcher" in c for c in d.values()) and d,
            240,
            "the harness to start",
        )
        assert any("prefect.server" in c for c in started.values()), [c[:100] for c in started.values()]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    left = lambda: [pid for pid in started if _alive(pid)]  # noqa: E731
    _wait(lambda: not left(), 60, f"the started processes to stop: {[started[p] for p in left()]}")
