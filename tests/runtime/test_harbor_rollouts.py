"""Harbor tasks through the pipeline in docker runtimes: their environment images (content-hashed, cached, never
pulled), the oracle scoring 1 and a no-op 0 through the ``harbor`` verifier, named reward components, and the
infrastructure failures (a build that fails, a verifier that crashes or times out) ending ERROR with their cause,
never a reward of 0. Tasks are copies of ``datasets/harbor-mini`` tasks, so their images are shared with the
dataset's own check."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from db.enums import RolloutStatus
from polar.errors import SandboxError
from polar.runtime.images import BuildSpec, base_images, ensure_image, image_tag
from polar.tasks.harbor import read_task
from tests.rollout.helpers import evaluations
from tests.runtime.conftest import IMAGE
from tests.runtime.test_docker_faults import drive, stage_error

DATASET = Path(__file__).resolve().parents[2] / "datasets" / "harbor-mini"


def copy_task(name: str, root: Path) -> Path:
    return Path(shutil.copytree(DATASET / name, root / "tasks" / name))


def test_base_images_of_a_dockerfile():
    text = "FROM polar/base:bookworm AS build\nRUN true\nFROM build\nFROM --platform=x scratch\nfrom other:1\n"
    assert base_images(text) == ["polar/base:bookworm", "other:1"]


def test_images_are_built_once_per_content(docker_engine, tmp_path: Path):
    context = tmp_path / "env"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {IMAGE}\nWORKDIR /app\nCOPY data.txt /app/\n")
    (context / "data.txt").write_text("one\n")
    spec = BuildSpec(context=str(context), name="polar-test-cache")
    tag = ensure_image(docker_engine, spec, tmp_path / "logs")
    assert tag == image_tag(spec) and (tmp_path / "logs").glob("*.log")
    log = next((tmp_path / "logs").glob("*.log")).read_text()
    assert "Successfully tagged" in log
    assert ensure_image(docker_engine, spec, tmp_path / "logs2") == tag and not (tmp_path / "logs2").exists()
    (context / "data.txt").write_text("two\n")
    changed = ensure_image(docker_engine, spec, tmp_path / "logs")
    assert changed != tag
    for name in (tag, changed):
        docker_engine.images.remove(name, force=True)


def test_a_missing_from_image_is_named_and_never_pulled(docker_engine, tmp_path: Path):
    (tmp_path / "Dockerfile").write_text("FROM polar/not-here:1\n")
    with pytest.raises(SandboxError, match="FROM image 'polar/not-here:1' is not on this Docker engine"):
        ensure_image(docker_engine, BuildSpec(context=str(tmp_path)), tmp_path / "logs")
    assert not (tmp_path / "logs").exists()  # refused before any build


async def test_oracle_scores_1_and_noop_0_with_named_components(docker_context, no_leaks):
    task = read_task(copy_task("rename-across-files", no_leaks))
    oracle, _ = await drive(docker_context, task.oracle_request(), no_leaks)
    assert oracle.status is RolloutStatus.COMPLETED and oracle.reward == 1.0, stage_error(oracle)
    (evaluation,) = evaluations(docker_context.factory, oracle.id)
    assert evaluation.evaluator == "harbor"
    assert evaluation.details["components"] == {"reward": 1.0, "tests": 1.0, "renamed": 1.0}
    noop, _ = await drive(docker_context, task.noop_request(), no_leaks)
    assert noop.status is RolloutStatus.COMPLETED and noop.reward == 0.0, stage_error(noop)
    (evaluation,) = evaluations(docker_context.factory, noop.id)
    assert evaluation.details["components"] == {"reward": 0.0, "tests": 0.0, "renamed": 0.0}


async def test_the_agent_never_sees_tests_or_the_oracle(docker_context, no_leaks):
    task = read_task(copy_task("hello-file", no_leaks))
    # Solves the task only when neither the tests nor an oracle is anywhere in its container.
    look = "test ! -e /tests && test ! -e /solution && test ! -e ../.polar/oracle && echo 'hello, polar' > greeting.txt"
    row, _ = await drive(docker_context, task.request({"name": "command", "config": {"command": look}}), no_leaks)
    assert row.status is RolloutStatus.COMPLETED and row.reward == 1.0, stage_error(row)


def _broken(root: Path, name: str, replace: dict[str, str]) -> dict:
    path = copy_task("hello-file", root)
    for relative, content in replace.items():
        (path / relative).write_text(content)
    return read_task(path.rename(path.with_name(name))).oracle_request()


async def test_a_verifier_that_crashes_is_an_error_not_a_zero(docker_context, no_leaks):
    task = _broken(no_leaks, "crash", {"tests/test.sh": "echo boom >&2; exit 3\n"})
    row, error = await drive(docker_context, task, no_leaks)
    assert row.status is RolloutStatus.ERROR and row.reward is None and error is not None
    assert "neither /logs/verifier/reward.txt nor reward.json" in row.error and "boom" in row.error


async def test_a_verifier_timeout_is_an_error_not_a_zero(docker_context, no_leaks):
    task = _broken(no_leaks, "slow", {"tests/test.sh": "sleep 30\n"})
    task["evaluator"]["timeout_s"] = 1.0
    row, _ = await drive(docker_context, task, no_leaks)
    assert row.status is RolloutStatus.ERROR and row.reward is None
    assert "timed out after 1 s" in row.error


async def test_an_image_that_fails_to_build_is_an_error_with_its_log(docker_context, no_leaks):
    task = _broken(no_leaks, "nobuild", {"environment/Dockerfile": f"FROM {IMAGE}\nRUN echo broken-step && false\n"})
    row, _ = await drive(docker_context, task, no_leaks)
    assert row.status is RolloutStatus.ERROR and row.reward is None
    assert row.error.startswith("init failed: image build of") and "non-zero code" in row.error
    log = Path(row.error.rsplit("(log: ", 1)[1].rstrip(")"))
    assert "broken-step" in log.read_text()


async def test_a_build_past_build_timeout_sec_is_an_error_not_a_zero(docker_context, no_leaks):
    slow = f"FROM {IMAGE}\nRUN echo {uuid.uuid4().hex}\nRUN sleep 30\n"  # a new layer each run: never cached
    path = copy_task("hello-file", no_leaks)
    (path / "environment" / "Dockerfile").write_text(slow)
    toml = path / "task.toml"
    toml.write_text(toml.read_text().replace("build_timeout_sec = 300.0", "build_timeout_sec = 2.0"))
    row, _ = await drive(docker_context, read_task(path.rename(path.with_name("slowbuild"))).oracle_request(), no_leaks)
    assert row.status is RolloutStatus.ERROR and row.reward is None
    assert row.error.startswith("init failed: image build of") and "past its timeout of 2 s" in row.error


async def test_the_verifier_runs_as_its_user_with_its_env(docker_context, no_leaks):
    check = (
        '#!/bin/bash\nif [ "$(id -un)" = nobody ] && [ "$GREETING_CHECK" = on ]; then echo 1; else echo 0; fi'
        " > /logs/verifier/reward.txt\n"
        'echo "as $(id -un), GREETING_CHECK=${GREETING_CHECK-unset}"\n'
    )
    path = copy_task("hello-file", no_leaks)
    (path / "tests" / "test.sh").write_text(check)
    toml = path / "task.toml"
    verifier = '[verifier]\ntimeout_sec = 60.0\nuser = "nobody"\nenv = { GREETING_CHECK = "on" }\n'
    toml.write_text(toml.read_text().replace("[verifier]\ntimeout_sec = 60.0\n", verifier))
    row, _ = await drive(docker_context, read_task(path.rename(path.with_name("asuser"))).oracle_request(), no_leaks)
    [evaluation] = evaluations(docker_context.factory, row.id)
    assert row.status is RolloutStatus.COMPLETED and row.reward == 1.0, (stage_error(row), evaluation.details)
    assert "as nobody, GREETING_CHECK=on" in evaluation.details["stdout"]
