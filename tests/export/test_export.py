"""Exports round-trip: RL and SFT rows, JSONL and parquet, checked against the store, with filters."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from db.models import Capture, Rollout, Task, Trajectory
from polar.errors import InvalidRequest
from polar.export import Acceptance, ExportFilter, export
from polar.export.schemas import from_parquet_message


def read(path):
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines()]
    rows = pq.read_table(path).to_pylist()
    for row in rows:
        row["metadata"] = json.loads(row["metadata"])
        if "messages" in row:
            row["messages"] = [from_parquet_message(m) for m in row["messages"]]
            row["tools"] = json.loads(row["tools"])
    return rows


def stored(factory, task_ids):
    with factory() as db:
        query = (
            sa.select(Trajectory)
            .join(Rollout, Rollout.id == Trajectory.rollout_id)
            .join(Task, Task.id == Rollout.task_id)
            .where(Task.id.in_(task_ids), Trajectory.builder == Task.builder)
            .order_by(Trajectory.id)
        )
        return {t.id: t for t in db.scalars(query)}


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_rl_rows_round_trip_token_arrays(store_context, batch, tmp_path, suffix):
    report = export(
        store_context.factory,
        store_context.settings,
        tmp_path / f"rl.{suffix}",
        filters=ExportFilter(task_ids=batch, include_scripted=True),
    )
    rows, expected = read(report.path), stored(store_context.factory, batch)
    assert report.rows == len(rows) == len(expected) == 4
    for row in rows:
        t = expected[row["trajectory_id"]]
        assert row["prompt_ids"] == list(t.prompt_ids) and row["response_ids"] == list(t.response_ids)
        assert row["loss_mask"] == list(t.loss_mask) and row["reward"] == t.reward
        assert max(abs(a - b) for a, b in zip(row["response_logprobs"], t.response_logprobs, strict=True)) < 1e-6
        assert row["harness"] == "agent" and row["metadata"]["split"] in ("train", "test")
        # The built-in agent's sessions are one main chain each (issue 16: the role columns are exported).
        assert (
            (row["role"], row["source_capture_id"], row["compacted"]) == (t.role, None, False) == ("main", None, False)
        )
        # What a trainer needs to pick the kept chain and see why a mask was zeroed (scripted replies here).
        assert (row["kept"], row["filter_reason"]) == (t.kept, t.filter_reason) == (True, "scripted")


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_sft_rows_hold_the_conversation_with_tool_calls(store_context, batch, tmp_path, suffix):
    accepted = ExportFilter(task_ids=batch, acceptance=Acceptance(min_reward=1.0, include_scripted=True))
    report = export(
        store_context.factory, store_context.settings, tmp_path / f"sft.{suffix}", kind="sft", filters=accepted
    )
    rows = read(report.path)
    assert report.rows == len(rows) == 2 and {r["reward"] for r in rows} == {1.0}
    for row in rows:
        roles = [m["role"] for m in row["messages"]]
        assert roles[0] in ("system", "user") and roles[-1] == "assistant" and "tool" in roles
        call = next(m for m in row["messages"] if m.get("tool_calls"))["tool_calls"][0]
        assert call["function"]["name"] == "bash" and json.loads(call["function"]["arguments"]) == {
            "command": "echo polar > answer.txt"
        }
        tool_result = next(m for m in row["messages"] if m["role"] == "tool")
        assert tool_result["tool_call_id"] == call["id"]
        assert [t["function"]["name"] for t in row["tools"]] == ["bash"]
        assert row["instruction"] == "Write the word polar into answer.txt."
    with store_context.factory() as db:
        # The last reply is the one sampled in the chain's last capture.
        last = db.scalars(
            sa.select(Capture).where(Capture.rollout_id == rows[0]["rollout_id"]).order_by(Capture.seq.desc())
        ).first()
        assert rows[0]["messages"][-1]["content"] == "Done." and last.n_output > 0


def test_filters_select_by_name_harness_reward_metadata_and_date(store_context, batch, tmp_path):
    def count(**kw) -> int:
        return export(
            store_context.factory,
            store_context.settings,
            tmp_path / "f.jsonl",
            filters=ExportFilter(task_ids=batch, include_scripted=True, **kw),
        ).rows

    assert count() == 4
    assert count(task_name="export-a") == 2 and count(metadata={"split": "test"}) == 2
    assert count(harness="agent") == 4 and count(harness="codex") == 0
    assert count(min_reward=1.0) == 2 and count(max_reward=0.0) == 2
    assert count(status=["TIMEOUT"]) == 0 and count(builder="per_request") == 0
    assert count(roles=["main"]) == 4 and count(roles=["sub_agent", "title"]) == 0
    from datetime import UTC, datetime, timedelta

    assert (
        count(since=datetime.now(UTC) + timedelta(hours=1)) == 0
        and count(until=datetime.now(UTC) + timedelta(hours=1)) == 4
    )


@pytest.mark.parametrize("kind", ["rl", "sft"])
def test_scripted_captures_never_reach_an_export_by_default(store_context, batch, tmp_path, kind):
    with store_context.factory() as db:  # the batch's captures were all made by scripted policies
        flags = set(db.scalars(sa.select(Capture.scripted).join(Rollout).where(Rollout.task_id.in_(batch))))
        assert flags == {True}
        assert set(db.scalars(sa.select(Trajectory.n_loss_tokens).join(Rollout).where(Rollout.task_id.in_(batch)))) == {
            0
        }
    for filters in (ExportFilter(task_ids=batch), ExportFilter(task_ids=batch, acceptance=Acceptance(min_reward=0.0))):
        report = export(
            store_context.factory, store_context.settings, tmp_path / f"{kind}.jsonl", kind=kind, filters=filters
        )
        assert report.rows == 0 and read(report.path) == []


def test_an_unknown_format_is_refused(store_context, tmp_path):
    with pytest.raises(InvalidRequest) as bad:
        export(store_context.factory, store_context.settings, tmp_path / "x.csv")
    assert bad.value.field == "format"
