"""A task's ``copy`` action reads the host only inside the configured copy roots (``POLAR_COPY_ROOTS``; none by
default), with symlinks resolved, and fails at once (no retries) outside them."""

from __future__ import annotations

import pytest

from polar.errors import PrepareFailed
from polar.rollout.prepare import run_prepare
from polar.rollout.spec import PrepareAction
from polar.runtime.local import LocalRuntime


def copy(source, path="in/x", attempts=3) -> PrepareAction:
    return PrepareAction(type="copy", source=str(source), path=path, max_attempts=attempts, retry_backoff_s=5)


async def test_copy_only_from_the_configured_roots(tmp_path):
    root = tmp_path / "data"
    (root / "repo").mkdir(parents=True)
    (root / "repo" / "a.txt").write_text("mine")
    secret = tmp_path / "secret.txt"
    secret.write_text("host file")
    (root / "link").symlink_to(secret)
    runtime = LocalRuntime("r", tmp_path / "runtimes")
    await runtime.start(fresh=True)

    with pytest.raises(PrepareFailed, match="none are configured"):
        await run_prepare(runtime, [copy("/etc/passwd")], copy_roots=[])
    for outside in (secret, root / "link", root / ".." / "secret.txt"):
        with pytest.raises(PrepareFailed, match="outside the folders") as failed:
            await run_prepare(runtime, [copy(outside)], copy_roots=[root])
        assert failed.value.field == "runtime.prepare.0"
    assert not (runtime.layout.work / "in").exists()

    report = await run_prepare(runtime, [copy(root / "repo", "repo")], copy_roots=[root])
    assert report[0].attempts == 1 and (runtime.layout.work / "repo" / "a.txt").read_text() == "mine"
