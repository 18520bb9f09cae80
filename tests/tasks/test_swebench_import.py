"""SWE-bench-style instances read into TaskRequests: image naming templates, a clear error per bad input, and the
official grading rules (swebench's log parser and report) on logs of real pytest runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polar.errors import InvalidRequest
from polar.evaluators.swebench import SWEbenchConfig, grade, patched_files
from polar.rollout.spec import parse_task_request
from polar.tasks import load_tasks
from polar.tasks.swebench import IMAGE_TEMPLATES, image_name, load_swebench, read_instance

DATASET = Path(__file__).resolve().parents[2] / "datasets" / "swe-mini" / "instances.jsonl"


def instances() -> list[dict]:
    return [json.loads(line) for line in DATASET.read_text().splitlines()]


def write(tmp_path: Path, rows: list) -> Path:
    path = tmp_path / "instances.jsonl"
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def test_the_dataset_imports_as_valid_task_requests():
    loaded = load_swebench(DATASET)
    assert len(loaded) >= 3
    for instance in loaded:
        request = parse_task_request(instance.request({"name": "agent"}, samples=3))
        assert request.runtime.options["image"] == instance.raw["image"] and request.runtime.options["seed_workdir"]
        assert request.runtime.options["network"] == "none"
        assert instance.raw["problem_statement"] in request.instruction
        assert instance.raw["test_patch"] not in request.instruction and "FAIL_TO_PASS" not in request.instruction
        assert request.evaluator.config["FAIL_TO_PASS"] == instance.raw["FAIL_TO_PASS"]
        oracle = parse_task_request(instance.oracle_request())
        assert oracle.runtime.prepare[0].content == instance.raw["patch"]
        assert oracle.runtime.prepare[0].path.startswith("../")  # beside the work folder, not in the agent's diff
    assert [t["num_samples"] for t in load_tasks(DATASET, samples=2)] == [2] * len(loaded)


def test_image_naming_templates():
    raw = {"instance_id": "django__django-11099", "repo": "django/django", "base_commit": "d26b2424437dabeeca94d7"}
    names = {dataset: image_name(raw, template) for dataset, template in IMAGE_TEMPLATES.items()}
    assert names["swebench"] == "sweb.eval.x86_64.django_1776_django-11099:latest"
    assert names["swe-gym"] == "xingyaoww/sweb.eval.x86_64.django_s_django-11099:latest"
    assert names["swe-smith"] == "jyangballin/swesmith.x86_64.django_1776_django.d26b2424:latest"
    assert names["r2e-gym"] == "namanjain12/django_final:d26b2424437dabeeca94d7"
    with pytest.raises(InvalidRequest, match="unknown field 'nope'"):
        image_name(raw, "x/{nope}")


def test_an_image_template_overrides_the_instance_image(tmp_path: Path):
    (first, *_) = instances()
    assert read_instance(first).image == first["image"]
    assert read_instance(first, template="mine/{id_docker}:v2").image == "mine/polar-example_1776_textkit-1:v2"
    del first["image"]
    assert read_instance(first, dataset="swe-gym").image.startswith("xingyaoww/sweb.eval.x86_64.")
    with pytest.raises(InvalidRequest, match="unknown dataset"):
        read_instance(first, dataset="nope")


@pytest.mark.parametrize("field", ["instance_id", "problem_statement", "patch", "test_patch", "FAIL_TO_PASS"])
def test_a_missing_field_is_named(tmp_path: Path, field: str):
    (first, *_) = instances()
    del first[field]
    with pytest.raises(InvalidRequest) as caught:
        load_swebench(write(tmp_path, [first]))
    assert caught.value.field == field and field in caught.value.message


def test_an_instance_without_the_grading_fields_is_refused(tmp_path: Path):
    (first, *_) = instances()
    del first["eval_script"]
    with pytest.raises(InvalidRequest, match="polar-example__textkit-1: eval_script is missing") as caught:
        load_swebench(write(tmp_path, [first]))
    assert caught.value.field == "eval_script"


def test_test_lists_may_be_json_strings_but_must_be_lists(tmp_path: Path):
    (first, *_) = instances()
    first["FAIL_TO_PASS"] = json.dumps(first["FAIL_TO_PASS"])  # how the Hugging Face exports keep them
    assert read_instance(first).grading.FAIL_TO_PASS == json.loads(first["FAIL_TO_PASS"])
    first["PASS_TO_PASS"] = {"a": 1}
    with pytest.raises(InvalidRequest, match="PASS_TO_PASS must be a list"):
        read_instance(first)
    first["PASS_TO_PASS"], first["eval_type"] = [], "sometimes"
    with pytest.raises(InvalidRequest, match="unknown eval_type"):
        read_instance(first)


def test_nothing_is_half_imported(tmp_path: Path):
    good, second, *_ = instances()
    with pytest.raises(InvalidRequest, match=r"instances.jsonl:2: not JSON"):
        load_swebench(write(tmp_path, [good, "{oops"]))
    with pytest.raises(InvalidRequest, match="appears twice"):
        load_swebench(write(tmp_path, [good, second, good]))
    with pytest.raises(InvalidRequest, match="no instances"):
        load_swebench(write(tmp_path, []))


def test_patched_files():
    (first, *_) = instances()
    assert patched_files(first["test_patch"]) == ["tests/test_slug.py"]


LOG = """+ : '>>>>> Start Test Output'
+ python3 -m pytest -rA -p no:cacheprovider tests/test_duration.py
============================= test session starts ==============================
collected 4 items

tests/test_duration.py {marks}                                               [100%]

=========================== short test summary info ============================
{lines}
+ : '>>>>> End Test Output'
"""


def _log(tmp_path: Path, statuses: dict[str, str]) -> str:
    lines = "\n".join(f"{status} tests/test_duration.py::{name}" for name, status in statuses.items())
    path = tmp_path / "eval.log"
    path.write_text(LOG.format(marks="." * len(statuses), lines=lines))
    return str(path)


def _config() -> SWEbenchConfig:
    (*_, third) = instances()
    return SWEbenchConfig.model_validate({k: v for k, v in read_instance(third).grading.model_dump().items()})


def test_grading_follows_the_official_report(tmp_path: Path):
    config = _config()
    everything = {"test_minutes": "PASSED", "test_hours": "PASSED", "test_seconds": "PASSED", "test_bad": "PASSED"}
    reward, details = grade(config, _log(tmp_path, everything))
    assert reward == 1.0 and details["resolution"] == "RESOLVED_FULL"
    assert details["tests_status"]["tests/test_duration.py::test_minutes"] == "PASSED"
    broke = {**everything, "test_hours": "FAILED"}
    reward, details = grade(config, _log(tmp_path, broke))
    assert reward == 0.0 and details["failed_pass_to_pass"] == ["tests/test_duration.py::test_hours"]
    unresolved = {**everything, "test_minutes": "FAILED"}
    reward, details = grade(config, _log(tmp_path, unresolved))
    assert reward == 0.0 and details["failed_fail_to_pass"] == ["tests/test_duration.py::test_minutes"]
    (tmp_path / "empty.log").write_text("the tests never ran\n")
    reward, details = grade(config, str(tmp_path / "empty.log"))
    assert reward == 0.0 and details["invalid_log"]
