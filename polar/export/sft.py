"""SFT data generation without Prefect: a task dataset in, rollouts through the pipeline, accepted conversations out.

A dataset is JSONL or parquet, one task per row: ``id`` (a stable key) and ``instruction`` are required;
``runtime``, ``evaluator``, ``metadata``, ``timeout_s``, ``agent_timeout_s`` and ``policies`` are taken when
present. Every task of a run carries ``metadata.sft_dataset`` and ``metadata.sft_key``, so a later run of the same
dataset skips the keys that already have an accepted conversation. ``flows.sft`` wraps this in a Prefect flow.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from db.models import Rollout, Task, Trajectory
from polar.errors import InvalidRequest
from polar.export import Acceptance, ExportFilter, export
from polar.export.filters import apply, meta_value
from polar.settings import Settings

ROW_FIELDS = ("runtime", "evaluator", "timeout_s", "agent_timeout_s", "policies")


def load_dataset(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a JSONL or parquet task dataset; each must have a string ``id`` and ``instruction``."""
    path = Path(path)
    if not path.is_file():
        raise InvalidRequest(f"no dataset file at {path}", field="dataset")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
    elif path.suffix in (".jsonl", ".json"):
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    else:
        raise InvalidRequest(f"a dataset is .jsonl or .parquet, not {path.suffix or 'no suffix'}", field="dataset")
    for index, row in enumerate(rows):
        for key in ("id", "instruction"):
            if not isinstance(row.get(key), str) or not row[key]:
                raise InvalidRequest(
                    f"dataset row {index} needs a non-empty string {key!r}", field=f"dataset.{index}.{key}"
                )
    return rows


def accepted_keys(factory: sessionmaker[Session], dataset: str, rule: Acceptance) -> set[str]:
    """The dataset keys that already have an accepted conversation in the store."""
    with factory() as db:
        dialect = db.get_bind().dialect.name
        query = (
            sa.select(meta_value(dialect, "sft_key"))
            .select_from(Trajectory)
            .join(Rollout, Rollout.id == Trajectory.rollout_id)
            .join(Task, Task.id == Rollout.task_id)
            .distinct()
        )
        query = apply(query, ExportFilter(metadata={"sft_dataset": dataset}, acceptance=rule), dialect)
        return {str(key) for key in db.scalars(query) if key is not None}


def task_requests(
    rows: Sequence[dict[str, Any]],
    *,
    dataset: str,
    harness: dict[str, Any],
    samples: int,
    evaluator: dict[str, Any] | None,
    teacher_model: str | None,
    builder: str,
    run_id: str,
) -> list[dict[str, Any]]:
    """One TaskRequest per row; the row's own evaluator wins over the run's."""
    harness = {**harness, **({"model": teacher_model} if teacher_model else {})}
    tasks = []
    for row in rows:
        task = {key: row[key] for key in ROW_FIELDS if row.get(key) is not None}
        task.setdefault("evaluator", evaluator)
        if task["evaluator"] is None:
            raise InvalidRequest(
                f"dataset row {row['id']!r} has no evaluator and the run gives none", field="evaluator"
            )
        metadata = {**(row.get("metadata") or {}), "sft_dataset": dataset, "sft_key": row["id"], "sft_run": run_id}
        tasks.append(
            {
                "name": f"{dataset}:{row['id']}"[:128],
                "instruction": row["instruction"],
                "harness": harness,
                "num_samples": samples,
                "builder": builder,
                "metadata": metadata,
                **task,
            }
        )
    return tasks


def export_accepted(
    factory: sessionmaker[Session],
    settings: Settings,
    task_ids: list[str],
    rule: Acceptance,
    output: Path,
    dataset: str,
    formats: Sequence[str],
) -> dict[str, Any]:
    """Write the run's accepted conversations (one file per format); returns their paths and row counts."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    files = {}
    for fmt in formats:
        path = output / f"{dataset}-{stamp}.{fmt}"
        report = export(factory, settings, path, kind="sft", filters=ExportFilter(task_ids=task_ids, acceptance=rule))
        files[fmt] = {"path": str(report.path), "rows": report.rows}
    return files
