"""Import-time check that an instance's patches apply: the test patch, then the gold patch on top of it, at the
instance's ``base_commit``, in a local git repository (a clone or mirror of the instance's ``repo``).

No network and no work tree: the base commit is read into a throwaway index (``GIT_INDEX_FILE``) and the patches
are applied to that index only (``git apply --cached``), so the repository's checkout is never touched. A patch
that does not apply is an ``InvalidRequest`` naming the instance, the patch field and the file git refused;
grading would otherwise find it only after the agent's whole run.

Where the repository is: ``repos`` is a folder that is itself a git repository holding the commit, or a folder of
clones named ``<owner>/<name>`` or ``<name>`` (the instance's ``repo``).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from polar.errors import InvalidRequest

# git apply's refusals name the file: "error: patch failed: FILE:LINE", "error: FILE: does not exist in index",
# "error: FILE: already exists in index", "error: corrupt patch at line N".
_FILE = re.compile(r"error: (?:patch failed: (?P<failed>[^:\n]+):\d+|(?P<other>[^:\n]+): (?:does not|already))")


def git(
    repo: Path, *args: str, env: dict[str, str] | None = None, stdin: str | None = None, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    """``git -C repo ARGS`` with its output captured (never raises on git's own failure: read ``returncode``)."""
    return subprocess.run(
        ["git", "-C", str(repo), *args], input=stdin, capture_output=True, text=True, env=env, timeout=timeout_s
    )


def find_repo(repos: Path, repo: str, commit: str) -> Path:
    """The local repository of ``repo`` (``owner/name``) under ``repos`` that holds ``commit``."""
    owner, _, name = repo.partition("/")
    for candidate in (repos / repo, repos / (name or owner), repos):
        if candidate.is_dir() and git(candidate, "cat-file", "-e", f"{commit}^{{commit}}").returncode == 0:
            return candidate
    raise InvalidRequest(
        f"no local repository of {repo} holding {commit[:12]} under {repos} (looked in {repo}, {name or owner} "
        "and the folder itself)",
        field="base_commit",
    )


def check_patches(instance: dict[str, Any], repos: Path) -> None:
    """Apply ``test_patch`` and then ``patch`` to ``base_commit``; ``InvalidRequest`` when either fails."""
    instance_id = str(instance["instance_id"])
    base = str(instance["base_commit"])
    try:
        repo = find_repo(Path(repos), str(instance["repo"]), base)
    except InvalidRequest as exc:
        raise InvalidRequest(f"instance {instance_id}: {exc.message}", field=exc.field) from None
    with tempfile.TemporaryDirectory(prefix="polar-patch-") as tmp:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(tmp) / "index")}
        read = git(repo, "read-tree", base, env=env)
        if read.returncode != 0:
            raise InvalidRequest(
                f"instance {instance_id}: base_commit {base[:12]} unreadable: {read.stderr.strip()}",
                field="base_commit",
            )
        # The gold patch is checked on top of the test patch, the order grading applies them in.
        for field in ("test_patch", "patch"):
            applied = git(repo, "apply", "--cached", "-", env=env, stdin=str(instance[field]))
            if applied.returncode != 0:
                error = applied.stderr.strip()
                match = _FILE.search(error)
                where = f" to {match['failed'] or match['other']}" if match else ""
                raise InvalidRequest(
                    f"instance {instance_id}: {field} does not apply{where} at base_commit {base[:12]}: "
                    f"{error.splitlines()[0] if error else 'git apply failed'}",
                    field=field,
                )
