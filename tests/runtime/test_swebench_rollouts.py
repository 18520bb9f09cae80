"""SWE-bench-format instances through the pipeline in docker runtimes, graded by the ``swebench`` evaluator: the
gold patch scores 1, a wrong fix 0 (its FAIL_TO_PASS test named), a fix that breaks a PASS_TO_PASS test 0 with
that test named, and a test patch that does not apply is an ERROR with its cause. The instances and their images
come from ``scripts/build_swe_instances.py`` (run once per session; images are cached by the engine)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from db.enums import RolloutStatus
from polar.tasks.swebench import SWEbenchInstance, load_swebench
from tests.rollout.helpers import evaluations
from tests.runtime.conftest import IMAGE
from tests.runtime.test_docker_faults import drive, stage_error

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def swe_instances(docker_engine, tmp_path_factory) -> dict[str, SWEbenchInstance]:
    """Both datasets' instances, rebuilt (their images too) by the script that made them, byte for byte: swe-mini
    from the project written in the script, swe-parse from the ``parse`` library's releases on PyPI."""
    spec = importlib.util.spec_from_file_location("build_swe_instances", REPO / "scripts" / "build_swe_instances.py")
    assert spec and spec.loader
    builder = importlib.util.module_from_spec(spec)
    sys.modules["build_swe_instances"] = builder
    spec.loader.exec_module(builder)
    instances = {}
    for project in ("textkit", "parse"):
        out = tmp_path_factory.mktemp("swe") / "instances.jsonl"
        builder.build(out, IMAGE, project)
        assert out.read_text() == (REPO / builder.PROJECTS[project].out).read_text()  # reproducible
        instances.update({instance.instance_id: instance for instance in load_swebench(out)})
    return instances


def command(text: str) -> dict:
    return {"name": "command", "config": {"command": text}}


async def test_gold_patch_scores_1_and_a_wrong_fix_0(docker_context, no_leaks, swe_instances):
    instance = swe_instances["polar-example__textkit-3"]
    gold, _ = await drive(docker_context, instance.oracle_request(), no_leaks)
    assert gold.status is RolloutStatus.COMPLETED and gold.reward == 1.0, stage_error(gold)
    (evaluation,) = evaluations(docker_context.factory, gold.id)
    assert evaluation.details["resolution"] == "RESOLVED_FULL"
    assert evaluation.details["tests_status"]["tests/test_duration.py::test_minutes"] == "PASSED"
    wrong = "sed -i 's/minutes + seconds/minutes * 61 + seconds/' textkit/duration.py"
    row, _ = await drive(docker_context, instance.request(command(wrong)), no_leaks)
    assert row.status is RolloutStatus.COMPLETED and row.reward == 0.0, stage_error(row)
    (evaluation,) = evaluations(docker_context.factory, row.id)
    assert evaluation.details["failed_fail_to_pass"] == ["tests/test_duration.py::test_minutes"]


async def test_a_fix_that_breaks_a_pass_to_pass_test_scores_0_naming_it(docker_context, no_leaks, swe_instances):
    instance = swe_instances["polar-example__textkit-3"]
    # Minutes fixed (FAIL_TO_PASS passes), seconds broken (test_seconds, a PASS_TO_PASS test, fails).
    breaks = "sed -i 's/minutes + seconds/minutes * 60 + seconds * 2/' textkit/duration.py"
    row, _ = await drive(docker_context, instance.request(command(breaks)), no_leaks)
    assert row.status is RolloutStatus.COMPLETED and row.reward == 0.0, stage_error(row)
    (evaluation,) = evaluations(docker_context.factory, row.id)
    assert evaluation.details["failed_pass_to_pass"] == ["tests/test_duration.py::test_seconds"]
    assert evaluation.details["failed_fail_to_pass"] == []


async def test_the_agent_sees_neither_the_test_patch_nor_the_gold_patch(docker_context, no_leaks, swe_instances):
    """During the run, no file in the agent's container holds the test patch's new test or the gold patch's line,
    and the grader's folders are not there yet. (The patterns are assembled by the shell, so the command's own text,
    wherever the harness keeps it, cannot match.)"""
    instance = swe_instances["polar-example__textkit-3"]
    look = (
        "found=$(grep -rlsF --include='*.py' --include='*.patch' --include='*.diff' --include='*.json*' "
        "--exclude-dir=proc --exclude-dir=sys --exclude-dir=dev "
        '-e "def test_$(echo minutes)" -e "minutes $(echo \'*\') 60 + seconds" /); '
        'echo "found:[$found] graders:[$(ls -d /tests /solution /patches 2>/dev/null)]"'
    )
    row, _ = await drive(docker_context, instance.request(command(look)), no_leaks)
    assert row.status is RolloutStatus.COMPLETED and row.reward == 0.0, stage_error(row)
    assert "found:[] graders:[]" in row.stage_results["run"]["stdout_tail"], row.stage_results["run"]


async def test_a_test_patch_that_does_not_apply_is_an_error(docker_context, no_leaks, swe_instances):
    instance = swe_instances["polar-example__textkit-1"]
    request = instance.oracle_request()
    config = request["evaluator"]["config"]
    config["test_patch"] = config["test_patch"].replace("def test_simple", "def test_elsewhere")
    row, _ = await drive(docker_context, request, no_leaks)
    assert row.status is RolloutStatus.ERROR and row.reward is None
    assert "the test patch does not apply" in row.error and "polar-example__textkit-1" in row.error
