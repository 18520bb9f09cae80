"""Import refuses a SWE-bench instance whose test patch or gold patch does not apply at its base commit, checked
offline in a local clone (the swe-mini project's history, rebuilt by scripts/build_swe_instances.py with the same
commit ids), naming the instance, the patch field and the file."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from polar.cli import main
from polar.errors import InvalidRequest
from polar.tasks.swebench import load_swebench

REPO = Path(__file__).resolve().parents[2]
DATASET = REPO / "datasets" / "swe-mini" / "instances.jsonl"


@pytest.fixture(scope="module")
def clones(tmp_path_factory) -> Path:
    """A folder of clones: ``textkit`` holding the project's history (no docker, no network)."""
    spec = importlib.util.spec_from_file_location("build_swe_instances", REPO / "scripts" / "build_swe_instances.py")
    assert spec and spec.loader
    builder = importlib.util.module_from_spec(spec)
    sys.modules["build_swe_instances"] = builder
    spec.loader.exec_module(builder)
    root = tmp_path_factory.mktemp("clones")
    (root / "textkit").mkdir()
    builder.make_history(root / "textkit")
    return root


def rows() -> list[dict]:
    return [json.loads(line) for line in DATASET.read_text().splitlines()]


def write(tmp_path: Path, instances: list[dict]) -> Path:
    path = tmp_path / "instances.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in instances))
    return path


def test_the_dataset_patches_apply_at_their_base_commits(clones):
    before = subprocess.run(["git", "-C", str(clones / "textkit"), "status", "--porcelain"], capture_output=True)
    assert len(load_swebench(DATASET, repos=clones)) == 3
    after = subprocess.run(["git", "-C", str(clones / "textkit"), "status", "--porcelain"], capture_output=True)
    assert before.stdout == after.stdout == b""  # the clone's checkout and index are untouched


def test_a_test_patch_that_does_not_apply_is_refused_naming_instance_and_file(clones, tmp_path):
    instances = rows()
    broken = instances[1]
    broken["test_patch"] = broken["test_patch"].replace("def test_simple", "def test_renamed")
    with pytest.raises(InvalidRequest) as err:
        load_swebench(write(tmp_path, instances), repos=clones)
    assert err.value.field == "test_patch"
    assert broken["instance_id"] in err.value.message and "tests/test_words.py" in err.value.message


def test_a_gold_patch_that_does_not_apply_is_refused(clones, tmp_path):
    instances = rows()
    instances[0]["patch"] = instances[0]["patch"].replace("textkit/slug.py", "textkit/missing.py")
    with pytest.raises(InvalidRequest) as err:
        load_swebench(write(tmp_path, instances), repos=clones)
    assert err.value.field == "patch" and "textkit/missing.py" in err.value.message


def test_a_base_commit_missing_from_the_clones_is_refused(clones, tmp_path):
    instances = rows()
    instances[2]["base_commit"] = "0" * 40
    with pytest.raises(InvalidRequest) as err:
        load_swebench(write(tmp_path, instances), repos=clones)
    assert err.value.field == "base_commit" and instances[2]["instance_id"] in err.value.message


def test_import_command_writes_nothing_when_a_patch_is_broken(clones, tmp_path, capsys):
    instances = rows()
    instances[2]["test_patch"] = instances[2]["test_patch"].replace("parse_duration", "parse_time")
    out = tmp_path / "tasks.json"
    broken = write(tmp_path, instances)
    assert main(["tasks", "import", "swebench", str(broken), "--repos", str(clones), "--out", str(out)]) != 0
    assert not out.exists()
    error = capsys.readouterr().err
    assert "polar-example__textkit-3: test_patch does not apply to tests/test_duration.py" in error
    assert main(["tasks", "import", "swebench", str(DATASET), "--repos", str(clones), "--out", str(out)]) in (0, None)
    assert len(json.loads(out.read_text())) == 3
