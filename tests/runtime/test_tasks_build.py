"""Images as their authors wrote them, through ``polar tasks build`` as a user types it and through the pipeline: a
Dockerfile that installs a Debian package fails offline (naming the way out) and builds on the build network; an
image built outside Polar is adopted as a task's image; a verifier that pip-installs from PyPI at verify time scores
with the verify network while the agent ran offline, and is an ERROR without it; a SWE-bench instance's image is
built from a local clone."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from db.enums import RolloutStatus
from polar.runtime.images import BuildSpec, image_tag
from polar.tasks.harbor import read_task
from tests.runtime.conftest import IMAGE, REPO
from tests.runtime.test_docker_faults import drive, stage_error
from tests.runtime.test_tasks_cli import polar
from tests.tasks.test_swebench_patches import clones  # noqa: F401  (the swe-mini project's history, rebuilt)

SWE_MINI = REPO / "datasets" / "swe-mini" / "instances.jsonl"
HOST_CA = os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt"
# Debian packages installed at build time. This machine reaches PyPI through a proxy whose CA is in the host's
# bundle: the image carries it, as an image built behind such a proxy does. One Dockerfile for every task here, so
# the engine's layer cache builds it once.
APT = (
    f"FROM {IMAGE}\nRUN apt-get update -q && apt-get install -y -q --no-install-recommends jq python3-pip\n"
    "COPY host-ca.crt /etc/host-ca.crt\nENV PIP_CERT=/etc/host-ca.crt\nWORKDIR /app\n"
)


@pytest.fixture(scope="module")
def made(docker_engine) -> Iterator[list[str]]:
    """Images the tests made, removed together at the end (so their layers serve as each other's cache)."""
    tags: list[str] = []
    yield tags
    for tag in tags:
        with contextlib.suppress(Exception):
            docker_engine.images.remove(tag, force=True)


def task_folder(root: Path, name: str, test_sh: str = "echo 1 > /logs/verifier/reward.txt\n") -> Path:
    folder = root / name
    (folder / "environment").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "solution").mkdir()
    (folder / "task.toml").write_text(
        'version = "1.0"\n\n[agent]\ntimeout_sec = 120.0\n\n[verifier]\ntimeout_sec = 300.0\n'
    )
    (folder / "instruction.md").write_text("Leave a note.\n")
    (folder / "environment" / "Dockerfile").write_text(APT)
    shutil.copyfile(HOST_CA, folder / "environment" / "host-ca.crt")
    (folder / "tests" / "test.sh").write_text("#!/bin/bash\nset -e\n" + test_sh)
    (folder / "solution" / "solve.sh").write_text("#!/bin/bash\necho note > /root/agent-note\n")
    return folder


def table(out: str) -> dict[str, list[str]]:
    """``polar tasks build``'s table: task -> [state, image, detail...]."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:3] == ["task", "state", "image"])
    return {line.split()[0]: line.split()[1:] for line in lines[start + 1 :] if line.strip()}


def test_tasks_build_as_typed_prints_each_tag(docker_engine, tmp_path, cache_dir, monkeypatch):
    monkeypatch.chdir(REPO)
    proc = polar("tasks", "build", "datasets/harbor-mini/hello-file", tmp_path=tmp_path, cache_dir=cache_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    state, image, *_ = table(proc.stdout)["hello-file"]
    spec = BuildSpec(context=str(REPO / "datasets/harbor-mini/hello-file/environment"), name="hello-file")
    assert state in ("built", "present") and image == image_tag(spec)
    assert docker_engine.images.get(image)


def test_a_dockerfile_that_installs_a_debian_package_builds_on_the_build_network(
    docker_engine, made, tmp_path, cache_dir
):
    name = f"apt-{uuid.uuid4().hex[:8]}"
    folder = task_folder(tmp_path, name)
    offline = polar("tasks", "build", "--network", "none", str(folder), tmp_path=tmp_path, cache_dir=cache_dir)
    assert offline.returncode == 1 and table(offline.stdout)[name][0] == "failed", offline.stdout + offline.stderr
    assert "polar tasks build --network host" in offline.stdout and "--adopt IMAGE" in offline.stdout

    tag = image_tag(BuildSpec(context=str(folder / "environment"), name=name))
    made.append(tag)
    built = polar("tasks", "build", "--network", "host", str(folder), tmp_path=tmp_path, cache_dir=cache_dir)
    assert built.returncode == 0, built.stdout + built.stderr
    assert table(built.stdout)[name][:2] == ["built", tag]
    jq = docker_engine.containers.run(tag, ["jq", "--version"], remove=True, network_mode="none")
    assert jq.startswith(b"jq-")
    again = polar("tasks", "build", str(folder), tmp_path=tmp_path, cache_dir=cache_dir)
    assert again.returncode == 0 and table(again.stdout)[name][:2] == ["present", tag]


def test_an_image_built_elsewhere_is_adopted_as_the_tasks_image(docker_engine, made, tmp_path, cache_dir):
    name = f"adopt-{uuid.uuid4().hex[:8]}"
    folder = task_folder(tmp_path, name)
    own = tmp_path / "own"
    own.mkdir()
    (own / "Dockerfile").write_text(f"FROM {IMAGE}\nRUN echo built-elsewhere > /marker\nWORKDIR /app\n")
    mine = f"polar-test/{name}:1"
    docker_engine.images.build(path=str(own), tag=mine, network_mode="none", rm=True)
    tag = image_tag(BuildSpec(context=str(folder / "environment"), name=name))
    made.extend((tag, mine))
    proc = polar("tasks", "build", "--adopt", mine, str(folder), tmp_path=tmp_path, cache_dir=cache_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert table(proc.stdout)[name][:2] == ["adopted", tag]
    assert docker_engine.images.get(tag).id == docker_engine.images.get(mine).id
    missing = polar(
        "tasks", "build", "--adopt", "polar-test/none:0", str(folder), tmp_path=tmp_path, cache_dir=cache_dir
    )
    assert missing.returncode == 1 and "is not on this engine" in missing.stdout


async def test_a_verifier_that_installs_from_pypi_scores_on_the_verify_network(
    docker_context, docker_engine, made, no_leaks
):
    """The agent ran offline and left a file outside its work folder; the verifier, on the host's network, pip-
    installs a package and finds the file: 1. On the agent's network (none) the install fails: an ERROR, not 0."""
    check = (
        "test -f /root/agent-note\n"
        "pip install -q --no-cache-dir --break-system-packages --index-url https://pypi.org/simple six==1.17.0\n"
        "python3 -c 'import six' && echo 1 > /logs/verifier/reward.txt\n"
    )
    name = f"pip-{uuid.uuid4().hex[:8]}"
    folder = task_folder(no_leaks / "tasks", name, check)
    docker_context.settings.docker_build_network = "host"
    made.append(image_tag(BuildSpec(context=str(folder / "environment"), name=name)))
    try:
        online = read_task(folder).oracle_request()
        online["evaluator"]["network"] = "host"
        row, _ = await drive(docker_context, online, no_leaks)
        assert row.status is RolloutStatus.COMPLETED and row.reward == 1.0, stage_error(row)
        assert row.stage_results["run"]["exit_code"] == 0

        row, _ = await drive(docker_context, read_task(folder).oracle_request(), no_leaks)
        assert row.status is RolloutStatus.ERROR and row.reward is None, stage_error(row)
        assert re.search(r"neither /logs/verifier/reward.txt nor reward.json", row.error), row.error
        assert not docker_engine.images.list(name="polar-state/*")  # the committed state went with its runtime
    finally:
        docker_context.settings.docker_build_network = "none"


def test_a_swe_instances_image_is_built_from_a_local_clone(docker_engine, clones, tmp_path, cache_dir):
    """The repository at /testbed at the base commit, nothing later in its history; without --repos the missing
    image is named with the way to build it."""
    row = json.loads(SWE_MINI.read_text().splitlines()[0])
    tag = f"polar-swe/test-{uuid.uuid4().hex[:8]}:latest"
    instances = tmp_path / "instances.jsonl"
    instances.write_text(json.dumps({**row, "image": tag}) + "\n")
    missing = polar("tasks", "build", str(instances), tmp_path=tmp_path, cache_dir=cache_dir)
    assert missing.returncode == 1 and "--repos DIR" in missing.stdout, missing.stdout + missing.stderr
    try:
        built = polar("tasks", "build", str(instances), "--repos", str(clones), tmp_path=tmp_path, cache_dir=cache_dir)
        assert built.returncode == 0, built.stdout + built.stderr
        assert table(built.stdout)[row["instance_id"]][:2] == ["built", tag]
        script = "git rev-parse HEAD && git log --format=%H | wc -l && pwd"
        out = docker_engine.containers.run(tag, ["bash", "-c", script], remove=True, network_mode="none").decode()
        head, commits, where = out.split()
        history = subprocess.run(
            ["git", "-C", str(clones / "textkit"), "rev-list", "--count", row["base_commit"]],
            capture_output=True,
            text=True,
            check=True,
        )
        assert (head, commits, where) == (row["base_commit"], history.stdout.strip(), "/testbed")
    finally:
        docker_engine.images.remove(tag, force=True)
