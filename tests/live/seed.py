"""A store seeded as a GRPO run leaves it: five registered weight versions, two task groups, four samples per
task, rewards rising with the version (the ``arith`` group learns faster than ``files``), trajectories with
trainable tokens and stage timings. Rows are written directly, so every value is known in advance (and Postgres
is covered); ``tests/ui/test_ui_grpo_curves_browser.py`` draws the curves of a real closed loop instead."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from db.engine import session_scope
from db.enums import RolloutStatus, TaskStatus
from db.models import Rollout, Task, Trajectory, WeightVersion

VERSIONS = [f"grpo-step-{i}" for i in range(5)]
SAMPLES = 4
SOLVED = {"arith": [1, 3, 4, 6, 7], "files": [0, 1, 2, 3, 5]}  # solved samples of 8 (two tasks) per version


def seed_rising(factory: sessionmaker[Session]) -> dict[str, list[float]]:
    """Write the run; returns the expected mean reward per group (and ``all``) by version."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    expected: dict[str, list[float]] = {"all": [], **{g: [] for g in SOLVED}}
    with session_scope(factory) as db:
        for v, version in enumerate(VERSIONS):
            db.add(WeightVersion(version=version, created_at=start + timedelta(minutes=10 * v)))
        db.flush()
        for v, version in enumerate(VERSIONS):
            for group, solved in SOLVED.items():
                expected[group].append(solved[v] / (2 * SAMPLES))
                for t in range(2):
                    task = Task(
                        name=f"{group}-{v}-{t}",
                        instruction="solve it",
                        harness={"name": "agent"},
                        runtime={},
                        evaluator={"type": "file"},
                        num_samples=SAMPLES,
                        meta={"group": group, "step": v},
                        status=TaskStatus.COMPLETED,
                    )
                    db.add(task)
                    db.flush()
                    for s in range(SAMPLES):
                        reward = 1.0 if t * SAMPLES + s < solved[v] else 0.0
                        finished = start + timedelta(minutes=10 * v + 5, seconds=s)
                        rollout = Rollout(
                            task_id=task.id,
                            sample_index=s,
                            status=RolloutStatus.COMPLETED,
                            reward=reward,
                            weight_version_min=version,
                            weight_version_max=version,
                            stage_timings={"run": {"duration_s": 20.0 - 2 * v}, "evaluate": {"duration_s": 1.0}},
                            created_at=finished - timedelta(seconds=30),
                            finished_at=finished,
                        )
                        db.add(rollout)
                        db.flush()
                        n = 40 + 10 * v
                        db.add(
                            Trajectory(
                                rollout_id=rollout.id,
                                builder="prefix_merge",
                                chain_index=0,
                                capture_ids=[],
                                prompt_ids=[1] * 8,
                                response_ids=[2] * n,
                                loss_mask=[1] * n,
                                response_logprobs=[0.0] * n,
                                reward=reward,
                                weight_version_min=version,
                                weight_version_max=version,
                                turn_count=1,
                                n_prompt=8,
                                n_response=n,
                                n_loss_tokens=n,
                                status="COMPLETED",
                            )
                        )
        for v in range(len(VERSIONS)):
            expected["all"].append(sum(SOLVED[g][v] for g in SOLVED) / (2 * 2 * SAMPLES))
    return expected
