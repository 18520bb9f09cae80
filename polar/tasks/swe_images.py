"""A SWE-bench instance's image from a local clone: the repository at ``/testbed`` holding only the history up to the
instance's base commit (a later fix is not in it), ``WORKDIR /testbed``, FROM an image already on the engine.

This is the shape SWE-bench's own images have where grading needs it (the repository at ``/testbed``, checked out
at ``base_commit``, ``git`` in the image); the project's dependencies are whatever the FROM image holds, so pick
one that has them (or build one from it first). The clone is never changed: it is cloned (shared, no copy of its
objects) into a temporary folder, whose ``snapshot`` branch is bundled into the build context. The build runs
offline unless ``network`` is ``host``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from polar.errors import SandboxError
from polar.tasks.patches import git


def _git(repo: Path, *args: str) -> None:
    done = git(repo, *args, timeout_s=600)
    if done.returncode != 0:
        raise SandboxError(f"git {' '.join(args[:2])} failed: {done.stderr.strip()[-300:]}")


def build_instance_image(
    client: Any, repo: Path, base_commit: str, tag: str, from_image: str, *, network: str = "none"
) -> None:
    """Build ``tag`` (see the module's docstring); ``SandboxError`` names what failed."""
    with tempfile.TemporaryDirectory(prefix="polar-swe-image-") as tmp:
        copy = Path(tmp) / "repo"
        _git(repo, "clone", "-q", "--shared", "--no-checkout", ".", str(copy))
        _git(copy, "branch", "-f", "snapshot", base_commit)
        _git(copy, "bundle", "create", "-q", str(Path(tmp) / "repo.bundle"), "snapshot")
        (Path(tmp) / "Dockerfile").write_text(
            f"FROM {from_image}\nCOPY repo.bundle /tmp/repo.bundle\n"
            f"RUN git clone -q -b snapshot /tmp/repo.bundle /testbed && cd /testbed && git checkout -q -B main "
            f"{base_commit} && git branch -D snapshot && git remote remove origin && rm /tmp/repo.bundle\n"
            f'LABEL polar.base_commit="{base_commit}"\nWORKDIR /testbed\n'
        )
        (Path(tmp) / ".dockerignore").write_text("repo\n")
        try:
            client.images.build(path=tmp, tag=tag, rm=True, forcerm=True, pull=False, network_mode=network)
        except Exception as exc:  # noqa: BLE001 - the engine's BuildError or APIError, named
            raise SandboxError(f"building {tag} from {repo} at {base_commit[:12]} failed: {exc}") from None
