"""The benchmark datasets through the ``polar`` CLI as a user runs it, in the docker runtime: ``polar tasks check``
finds every ``datasets/harbor-mini`` task and every ``datasets/swe-mini`` and ``datasets/swe-parse`` instance sound
(oracle 1, no-op 0) and a broken copy broken (exit 1, named), from a fresh ``POLAR_HOME`` whose tools folder is
empty (oracle and no-op runs call no model, so they start no gateway relay and need no Node), and ``polar run`` on
Harbor task folders with ``--samples 4`` prints each task's group.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.runtime.conftest import REPO, tools_dir
from tests.runtime.test_swebench_rollouts import swe_instances  # noqa: F401  (the datasets' images, rebuilt)

HARBOR = REPO / "datasets" / "harbor-mini"
SWE = [REPO / "datasets" / name / "instances.jsonl" for name in ("swe-mini", "swe-parse")]


def polar(*args: str, tmp_path: Path, cache_dir: Path, tools: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(Path.home()),
        "POLAR_HOME": str(tmp_path / "home"),
        "POLAR_CACHE": str(cache_dir),
        "POLAR_TOOLS": str(tools or tools_dir()),
    }
    return subprocess.run(
        [sys.executable, "-m", "polar.cli", *args], env=env, capture_output=True, text=True, timeout=900, check=False
    )


def verdicts(out: str) -> dict[str, str]:
    """``polar tasks check``'s verdict table: task -> its verdict (``ok`` or ``BROKEN: ...``)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:3] == ["task", "oracle", "no-op"])
    table = lines[start + 1 :]
    return {line.split()[0]: line.split(maxsplit=3)[3] for line in table if len(line.split()) >= 4}


def test_tasks_check_finds_the_datasets_sound_and_a_broken_copy_broken(swe_instances, tmp_path, cache_dir):
    broken = Path(shutil.copytree(HARBOR / "hello-file", tmp_path / "broken-hello"))
    (broken / "solution" / "solve.sh").write_text("#!/bin/bash\ntrue\n")  # an oracle that solves nothing

    no_tools = tmp_path / "no-tools"
    proc = polar(
        "tasks",
        "check",
        str(HARBOR),
        *map(str, SWE),
        str(broken),
        tmp_path=tmp_path,
        cache_dir=cache_dir,
        tools=no_tools,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = verdicts(proc.stdout)
    harbor = sorted(p.name for p in HARBOR.iterdir() if (p / "task.toml").exists())
    instances = [
        re.search(r'"instance_id": "([^"]+)"', row)[1] for path in SWE for row in path.read_text().splitlines()
    ]
    assert len(harbor) == 8 and len(instances) == 6
    for task in [*harbor, *instances]:
        assert found.get(task) == "ok", (task, found)
    assert found["broken-hello"].startswith("BROKEN: oracle scored 0.00, not 1"), found
    assert "14 of 15 tasks sound, 1 broken" in proc.stdout and not no_tools.exists()


def test_polar_run_on_task_folders_prints_each_tasks_group(docker_engine, tmp_path, cache_dir):
    tasks = tmp_path / "tasks"
    for name in ("hello-file", "csv-totals", "json-config"):
        shutil.copytree(HARBOR / name, tasks / name)
    (tasks / "json-config").rename(tasks / "unbuildable")
    dockerfile = tasks / "unbuildable" / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "RUN exit 3\n")  # its image fails to build: ERROR, not 0
    fix = '{"command": "echo \'hello, polar\' > /app/greeting.txt"}'  # solves hello-file, not csv-totals
    proc = polar(
        "run", str(tasks), "--samples", "4", "--harness", "command", "--harness-config", fix,
        tmp_path=tmp_path, cache_dir=cache_dir,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["task", "samples"])
    table = lines[start : start + 4]
    rows = {line.split()[0]: line.split()[1:] for line in table[1:]}
    assert rows == {
        "csv-totals": ["4", "4", "0", "0.00", "0.00", "0/4"],
        "hello-file": ["4", "4", "0", "1.00", "0.00", "4/4"],
        "unbuildable": ["4", "0", "4", "-", "-", "0/0"],
    }, table
    assert "12 rollouts: COMPLETED 8, ERROR 4; mean reward 0.50 (4 solved)" in proc.stdout


def test_a_run_whose_stage_fails_says_how_to_mend_it_and_its_logs_reach_prefect(docker_engine, tmp_path, cache_dir):
    """A tools folder without Node: the run stage fails (its error says what to install), and Prefect's logs of
    the failed task runs reach its temporary server before it stops (drained at exit they failed with "Error
    logging to API")."""
    shutil.copytree(HARBOR / "hello-file", tmp_path / "tasks" / "hello-file")
    empty = tmp_path / "no-tools"
    empty.mkdir()
    proc = polar(
        "run", str(tmp_path / "tasks"), "--harness", "command", "--harness-config", '{"command": "true"}',
        tmp_path=tmp_path, cache_dir=cache_dir, tools=empty,
    )  # fmt: skip
    assert "1 rollouts: ERROR 1" in proc.stdout, proc.stdout[-3000:]
    assert "run `polar harness install node`" in proc.stderr
    assert "Error logging to API" not in proc.stderr, proc.stderr[-2000:]
