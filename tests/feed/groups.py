"""Synthetic finished groups written straight into the store (the feed reads rows, not the pipeline)."""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from db.engine import session_scope
from db.enums import RolloutStatus, TaskStatus
from db.models import Rollout, Task, Trajectory
from polar.rollout.state import now


def add_group(
    factory: sessionmaker[Session],
    *,
    samples: int = 4,
    version: str | None = "default",
    status: TaskStatus = TaskStatus.COMPLETED,
    builder: str = "prefix_merge",
    other_builder: bool = True,
    errors: int = 0,
) -> tuple[str, list[int]]:
    """A task with ``samples`` finished rollouts, one trajectory each (plus one of another builder, which a
    claim must not hand out), the last ``errors`` of them ERROR (masked, no reward); returns the task id and its
    trajectory ids of ``builder``."""
    with session_scope(factory) as db:
        task = Task(
            instruction="toy",
            harness={},
            runtime={},
            evaluator={},
            builder=builder,
            num_samples=samples,
            meta={"group": "g"},
            status=status,
            finished_at=now() if status in (TaskStatus.COMPLETED, TaskStatus.FAILED) else None,
        )
        db.add(task)
        db.flush()
        ids = []
        for index in range(samples):
            error = index >= samples - errors
            rollout = Rollout(
                task_id=task.id,
                sample_index=index,
                status=RolloutStatus.ERROR if error else RolloutStatus.COMPLETED,
                stage_results={},
                stage_timings={},
                reward=None if error else float(index % 2),
                weight_version_min=version,
                weight_version_max=version,
            )
            db.add(rollout)
            db.flush()
            for name in (builder, "per_request") if other_builder else (builder,):
                row = Trajectory(
                    rollout_id=rollout.id,
                    builder=name,
                    chain_index=0,
                    capture_ids=[1],
                    prompt_ids=[1, 2, 3],
                    response_ids=[4, 5, 6],
                    loss_mask=[0, 0, 0] if error else [1, 0, 1],
                    response_logprobs=[-0.5, 0.0, -0.25],
                    reward=None if error else float(index % 2),
                    weight_version_min=version,
                    weight_version_max=version,
                    turn_count=2,
                    n_prompt=3,
                    n_response=3,
                    n_loss_tokens=0 if error else 2,
                    status="ERROR" if error else "COMPLETED",
                )
                db.add(row)
                db.flush()
                if name == builder:
                    ids.append(row.id)
        return task.id, ids
