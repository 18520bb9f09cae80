"""Task builders and store queries shared by the rollout and flow tests.

Harnesses take scripted actions: the gateway answers the built-in agent with scripted tool calls (real token ids
scored by the real local model), so a test decides what the agent does and everything else stays real.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from db.models import Capture, Evaluation, Rollout, Trajectory
from polar.settings import Settings

GIT_INIT = "git init -q . && git add -A && git -c user.email=t@polar -c user.name=t commit -q --allow-empty -m start"


def bash(command: str) -> dict[str, Any]:
    return {"content": "", "tool_calls": [{"name": "bash", "arguments": {"command": command}}]}


def script(*commands: str, final: str = "Done.") -> dict[str, Any]:
    return {"type": "scripted", "replies": [*(bash(c) for c in commands), {"content": final}]}


SOLVE = script("echo polar > answer.txt")
FAIL = script("echo nope > answer.txt")


def answer_task(
    *, name: str = "answer", samples: int = 2, policies: list | None = None, **extra: Any
) -> dict[str, Any]:
    """Write 'polar' into answer.txt; rewarded by a file check. ``extra`` overrides TaskRequest fields."""
    task: dict[str, Any] = {
        "name": name,
        "instruction": "Write the word polar into answer.txt.",
        "harness": {"name": "agent", "config": {"max_turns": 4}},
        "runtime": {"prepare": [{"command": GIT_INIT}]},
        "evaluator": {"type": "file", "config": {"path": "answer.txt", "equals": "polar"}},
        "num_samples": samples,
        "policies": policies or [SOLVE, FAIL],
    }
    task.update(extra)
    return task


def test_settings(tmp: Path, cache: Path, database_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "home": tmp,
        "cache": cache,
        "database_url": database_url,
        "runtime_root": tmp / "runtimes",
        "heartbeat_s": 1.0,
        "stage_retry_delay_s": 0.0,
        "allow_scripted_policies": True,  # the tests script their replies (tests/api/test_api_scripted.py: refused)
    }
    values.update(overrides)
    return Settings(**values)


test_settings.__test__ = False  # type: ignore[attr-defined]  # a factory, not a test


def rollout_row(factory: sessionmaker[Session], rollout_id: str) -> Rollout:
    with factory() as db:
        row = db.get(Rollout, rollout_id)
        assert row is not None
        return row


def captures(factory: sessionmaker[Session], rollout_id: str) -> list[Capture]:
    with factory() as db:
        return list(db.scalars(sa.select(Capture).where(Capture.rollout_id == rollout_id).order_by(Capture.seq)))


def trajectories(factory: sessionmaker[Session], rollout_id: str) -> list[Trajectory]:
    with factory() as db:
        return list(
            db.scalars(
                sa.select(Trajectory).where(Trajectory.rollout_id == rollout_id).order_by(Trajectory.chain_index)
            )
        )


def evaluations(factory: sessionmaker[Session], rollout_id: str) -> list[Evaluation]:
    with factory() as db:
        return list(db.scalars(sa.select(Evaluation).where(Evaluation.rollout_id == rollout_id)))
