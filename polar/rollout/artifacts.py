"""What postrun keeps of a rollout's working folder: the agent's changes as a git diff.

When the working folder is a git repository, the diff against ``HEAD`` (untracked files included, binary as
git's binary patch) is written to ``artifacts/diff.patch`` and summarised in the stage result (its first
``DIFF_EXCERPT_CHARS`` characters, its size, the changed paths). A temporary index is used, so the agent's own
index is left as it was. A folder that is not a repository gets a list of its files instead.

``keep_artifacts`` (the run stage, as soon as the harness has ended) also stores what postrun and evaluate need
if they run on another host (``artifact_store``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from db.stage_reports import ArtifactSummary, KeptArtifact
from polar.runtime.base import Runtime

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from polar.rollout.state import RolloutView
    from polar.settings import Settings

DIFF_EXCERPT_CHARS = 65_536
FILE_LIST_LIMIT = 200


async def collect_artifacts(runtime: Runtime) -> ArtifactSummary:
    work = runtime.layout.work
    if not (work / ".git").exists():
        files = sorted(str(p.relative_to(work)) for p in work.rglob("*") if p.is_file())
        return ArtifactSummary(git=False, files=files[:FILE_LIST_LIMIT], file_count=len(files))
    index = runtime.layout.private / "artifacts.index"
    patch = runtime.layout.artifacts / "diff.patch"
    env = {"GIT_INDEX_FILE": str(index)}
    # A repository without commits is diffed against the empty tree.
    script = (
        f"cp .git/index {index} 2>/dev/null || rm -f {index}; "
        "base=$(git rev-parse -q --verify HEAD || git hash-object -t tree /dev/null) && git add -A . && "
        f'git diff --cached --binary "$base" > {patch} && git diff --cached --name-only "$base"'
    )
    result = await runtime.exec(script, env=env, timeout_s=120)
    if not result.ok:
        return ArtifactSummary(git=True, error=f"git diff failed: {result.stderr[-300:].strip()}")
    diff = patch.read_text(errors="replace") if patch.exists() else ""
    return ArtifactSummary(
        git=True,
        diff=diff[:DIFF_EXCERPT_CHARS],
        diff_bytes=len(diff.encode()),
        diff_truncated=len(diff) > DIFF_EXCERPT_CHARS,
        changed=result.stdout.splitlines(),
        patch_file=str(patch),
    )


async def keep_artifacts(
    factory: sessionmaker[Session], settings: Settings, view: RolloutView, runtime: Runtime
) -> ArtifactSummary:
    """``collect_artifacts`` and keep what a later stage may need on another host (``artifact_store``); the
    summary's ``kept`` maps each artifact's name to its manifest entry."""
    from polar.rollout import artifact_store

    summary = await collect_artifacts(runtime)
    work = runtime.layout.work

    def keep() -> dict[str, KeptArtifact]:
        kept: dict[str, KeptArtifact] = {}

        def put(name: str, data: bytes) -> None:
            kept[name] = artifact_store.save(factory, settings, view.id, name, data)

        if summary.git and summary.patch_file:
            put("diff.patch", Path(summary.patch_file).read_bytes())
        elif not summary.git:
            put("work.tar.gz", artifact_store.tar_folder(work))
        for path in view.task.evaluator.copy_paths:
            source = work / path
            if source.is_file():
                put(f"work/{path}", source.read_bytes())
            elif source.is_dir():
                put(f"work/{path}.tar.gz", artifact_store.tar_folder(source))
            else:
                kept[f"work/{path}"] = KeptArtifact(stored=False, absent=True)  # the agent left no such file
        for name in artifact_store.LOG_FILES:
            log = runtime.layout.logs / name
            if log.is_file():
                put(f"logs/{name}", log.read_bytes())
        return kept

    if summary.git and summary.error:
        return summary
    return summary.model_copy(update={"kept": await asyncio.to_thread(keep)})
