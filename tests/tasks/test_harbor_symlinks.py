"""Harbor imports never follow a symlink out of a task folder: a link anywhere in it (instruction, tests,
solution, the environment's build context) whose target lies outside the folder, or that loops, refuses the
import with the link named, before any file is read; so does a task folder that is a link out of its dataset.
Links that stay inside the folder are followed as before. Through the control API's import, whose path must lie
in ``POLAR_COPY_ROOTS``, this keeps the import inside the roots."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from polar.api.imports import TaskImport, import_requests
from polar.errors import InvalidRequest
from polar.settings import Settings
from polar.tasks.harbor import load_harbor, read_task

DATASET = Path(__file__).resolve().parents[2] / "datasets" / "harbor-mini"
SECRET = "the host's secret\n"


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(a copy root holding a dataset with one task, the task folder, a secret file outside the root)."""
    root = tmp_path / "root"
    task = Path(shutil.copytree(DATASET / "fix-kv-parser", root / "dataset" / "fix-kv-parser"))
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text(SECRET)
    return root, task, secret


def _refused(path: Path) -> str:
    with pytest.raises(InvalidRequest) as caught:
        load_harbor([path])
    assert SECRET.strip() not in caught.value.message
    return caught.value.message


@pytest.mark.parametrize(
    "link",
    ["tests/helper.txt", "instruction.md", "environment/secret.txt", "solution/notes.md", "tests/more"],
)
def test_a_link_out_of_the_task_folder_is_refused_and_named(layout, link: str):
    root, task, secret = layout
    path = task / link
    path.unlink(missing_ok=True)
    # A file link, or (tests/more) a folder link: both point outside the copy root.
    os.symlink(secret.parent if link == "tests/more" else secret, path)
    message = _refused(task.parent)
    assert f"harbor task fix-kv-parser: {link}: a symlink: it points to {path.readlink()}" in message
    assert "outside the task folder" in message


def test_a_relative_link_climbing_out_and_a_loop_are_refused(layout):
    _, task, _ = layout
    os.symlink("../../../outside/secret.txt", task / "tests" / "climb.txt")
    assert "tests/climb.txt: a symlink: it points to ../../../outside/secret.txt" in _refused(task)
    (task / "tests" / "climb.txt").unlink()
    os.symlink("loop-b", task / "tests" / "loop-a")
    os.symlink("loop-a", task / "tests" / "loop-b")
    assert "tests/loop-a: a symlink: it does not resolve" in _refused(task)


def test_a_task_folder_that_links_out_of_its_dataset_is_refused(layout, tmp_path):
    root, task, _ = layout
    elsewhere = Path(shutil.copytree(task, tmp_path / "outside" / "other-task"))
    os.symlink(elsewhere, task.parent / "linked-task")
    message = _refused(task.parent)
    assert "harbor task linked-task" in message and "the task folder is a symlink: it points to" in message


def test_links_that_stay_inside_the_task_folder_are_followed(layout):
    _, task, _ = layout
    os.symlink("test.sh", task / "tests" / "again.sh")
    os.symlink("../tests", task / "solution" / "tests-view")
    imported = read_task(task)
    assert imported.tests["again.sh"] == imported.tests["test.sh"]


def test_the_control_apis_import_stays_inside_the_copy_roots(layout):
    root, task, secret = layout
    settings = Settings(home=root.parent / "home", copy_roots=str(root))
    assert len(import_requests(TaskImport(path=str(task.parent)), settings)) == 1
    os.symlink(secret, task / "tests" / "leak.txt")
    with pytest.raises(InvalidRequest, match="tests/leak.txt: a symlink"):
        import_requests(TaskImport(path=str(task.parent)), settings)
