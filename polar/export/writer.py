"""Streaming exports of trajectories: RL rows (token ids, loss mask, logprobs, reward, versions) or SFT rows
(OpenAI-style messages and tools, one conversation per line, plus its prompt and response ids and loss mask), as
JSONL or parquet.

Rows are read with ``yield_per`` (a server-side cursor on Postgres) and written ``batch_rows`` at a time (a
parquet row group per batch), so memory stays bounded by one batch whatever the store holds.

    report = export(factory, settings, Path("out.parquet"), kind="rl", filters=ExportFilter(min_reward=1))
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from db.models import Capture, Rollout, Task, Trajectory
from polar.errors import InvalidRequest
from polar.export.conversations import ReplyParser, conversation
from polar.export.extras import extras_columns
from polar.export.filters import ExportFilter, apply, harness_name
from polar.export.schemas import RL_SCHEMA, SFT_SCHEMA
from polar.settings import Settings


class ExportKind(StrEnum):
    RL = "rl"
    SFT = "sft"


@dataclass(frozen=True)
class ExportReport:
    path: Path
    kind: ExportKind
    rows: int
    bytes: int


def _common(trajectory: Trajectory, rollout: Rollout, task: Task | None, harness: str | None) -> dict[str, Any]:
    """The columns every export row has; ``task`` is None for a gateway-only session (its task columns are null)."""
    return {
        "trajectory_id": trajectory.id,
        "task_id": task.id if task is not None else None,
        "task_name": task.name if task is not None else None,
        "rollout_id": rollout.id,
        "sample_index": rollout.sample_index,
        "harness": harness,
        "builder": trajectory.builder,
        "chain_index": trajectory.chain_index,
        "reward": trajectory.reward,
        "status": trajectory.status,
        "finish_reason": trajectory.finish_reason,
        "weight_version_min": trajectory.weight_version_min,
        "weight_version_max": trajectory.weight_version_max,
        "turn_count": trajectory.turn_count,
        "role": trajectory.role,
        "source_capture_id": trajectory.source_capture_id,
        "compacted": trajectory.compacted,
        # Per response span, the regime its tokens were sampled under (polar.trajectory.sampling); null on rows
        # built before revision 0020 (not recorded: rebuild them).
        "sampling_spans": trajectory.sampling_spans,
        "created_at": trajectory.created_at.isoformat(),
        "metadata": (task.meta if task is not None else None) or {},
    }


def rl_row(trajectory: Trajectory, rollout: Rollout, task: Task | None, harness: str | None) -> dict[str, Any]:
    return {
        **_common(trajectory, rollout, task, harness),
        "prompt_ids": list(trajectory.prompt_ids),
        "response_ids": list(trajectory.response_ids),
        "loss_mask": list(trajectory.loss_mask),
        "response_logprobs": list(trajectory.response_logprobs),
        "version_spans": trajectory.version_spans or [],
        "n_prompt": trajectory.n_prompt,
        "n_response": trajectory.n_response,
        "n_loss_tokens": trajectory.n_loss_tokens,
        "kept": trajectory.kept,
        "filter_reason": trajectory.filter_reason,
    }


def rows(
    factory: sessionmaker[Session], settings: Settings, kind: ExportKind, filters: ExportFilter, *, yield_per: int = 500
) -> Iterator[dict[str, Any]]:
    """Export rows in trajectory-id order, streamed from the store.

    An SFT row's conversation is read through a second session, emptied after each row: the streaming session
    must not be expunged while ``yield_per`` holds its next batch (that broke every export past one batch)."""
    with factory() as db, factory() as side:
        dialect = db.get_bind().dialect.name
        query = (
            sa.select(Trajectory, Rollout, Task, harness_name(dialect))
            .join(Rollout, Rollout.id == Trajectory.rollout_id)
            .join(Task, Task.id == Rollout.task_id, isouter=True)  # a gateway-only session has no task
            .order_by(Trajectory.id)
            .execution_options(yield_per=yield_per)
        )
        parse_reply = ReplyParser(settings) if kind is ExportKind.SFT else None
        for trajectory, rollout, task, harness in db.execute(apply(query, filters, dialect)):
            if parse_reply is None:  # an RL row is the trajectory's own token arrays (and its captures' extras)
                yield rl_row(trajectory, rollout, task, harness) | extras_columns(db, trajectory)
                continue
            last = side.get(Capture, trajectory.capture_ids[-1]) if trajectory.capture_ids else None
            if last is None:
                continue
            messages, tools = conversation(side, last, parse_reply)
            side.expunge_all()  # the chain's captures were loaded to rebuild the request: let them go
            yield {
                **_common(trajectory, rollout, task, harness),
                "instruction": task.instruction if task is not None else None,
                "messages": messages,
                "tools": tools,
                # The same conversation as tokens, for SFT on exactly what the model saw and sampled.
                "prompt_ids": list(trajectory.prompt_ids),
                "response_ids": list(trajectory.response_ids),
                "loss_mask": list(trajectory.loss_mask),
            }


def _format(path: Path, fmt: str | None) -> str:
    fmt = fmt or path.suffix.lstrip(".")
    if fmt not in ("jsonl", "parquet"):
        raise InvalidRequest(f"export format must be jsonl or parquet, not {fmt!r}", field="format")
    return fmt


def export(
    factory: sessionmaker[Session],
    settings: Settings,
    path: Path,
    *,
    kind: ExportKind | str = ExportKind.RL,
    filters: ExportFilter | None = None,
    fmt: str | None = None,
    batch_rows: int = 1000,
) -> ExportReport:
    """Write the matching trajectories to ``path`` (format from ``fmt`` or the suffix); returns what was written."""
    kind, fmt, filters = ExportKind(kind), _format(path, fmt), filters or ExportFilter()
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    stream = rows(factory, settings, kind, filters, yield_per=batch_rows)
    if fmt == "jsonl":
        with path.open("w", encoding="utf-8") as out:
            for row in stream:
                out.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
                count += 1
    else:
        count = _write_parquet(path, stream, RL_SCHEMA if kind is ExportKind.RL else SFT_SCHEMA, batch_rows)
    return ExportReport(path, kind, count, path.stat().st_size)


def _write_parquet(path: Path, stream: Iterator[dict[str, Any]], schema: Any, batch_rows: int) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from polar.export.schemas import to_arrow_row

    count, batch = 0, []
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        for row in stream:
            batch.append(to_arrow_row(row))
            if len(batch) >= batch_rows:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                count, batch = count + len(batch), []
        if batch or count == 0:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
            count += len(batch)
    return count
