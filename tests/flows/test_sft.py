"""The SFT generation flow on SQLite and Postgres: a dataset in, accepted conversations exported, and a second
run skipping what was accepted. The teacher's actions are scripted per row (``policies``), so which sample is
accepted is known."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from db.models import Task
from flows.sft import sft_generation
from polar.errors import InvalidRequest
from polar.export.sft import load_dataset
from polar.rollout.context import store_factory
from tests.rollout.helpers import FAIL, SOLVE

EVALUATOR = {"type": "file", "config": {"path": "answer.txt", "equals": "polar"}}


def write_dataset(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


async def test_a_run_exports_accepted_conversations_and_a_rerun_skips_them(flow_env, tmp_path):
    rows = [
        {
            "id": "solved",
            "instruction": "Write polar into answer.txt.",
            "policies": [SOLVE, FAIL],
            "metadata": {"repo": "a"},
        },
        {"id": "failed", "instruction": "Write polar into answer.txt.", "policies": [FAIL]},
    ]
    dataset = write_dataset(tmp_path / "tasks.jsonl", rows)
    params = {
        "dataset": dataset,
        "harness": {"name": "agent", "config": {"max_turns": 4}},
        "name": "toy",
        "samples_per_task": 2,
        "evaluator": EVALUATOR,
        "teacher_model": "teacher-x",
        "output": str(tmp_path / "out"),
        "acceptance": {"include_scripted": True},  # the toy teacher is scripted; scripted rows are out by default
    }
    first = await sft_generation(**params)
    assert (first["rows"], first["skipped"], first["tasks"], first["attempts"], first["accepted"]) == (2, 0, 2, 4, 1)
    table = pq.read_table(first["files"]["parquet"]["path"]).to_pylist()
    lines = [json.loads(line) for line in Path(first["files"]["jsonl"]["path"]).read_text().splitlines()]
    assert len(table) == len(lines) == 1
    row = lines[0]
    assert row["metadata"]["sft_key"] == "solved" and row["metadata"]["repo"] == "a" and row["reward"] == 1.0
    assert [m["role"] for m in row["messages"]][-1] == "assistant"
    assert [m["role"] for m in table[0]["messages"]] == [m["role"] for m in row["messages"]]
    factory = store_factory()
    with factory() as db:
        harnesses = {t.harness["model"] for t in db.scalars(sa.select(Task).where(Task.name.like("toy:%")))}
    assert harnesses == {"teacher-x"}

    again = await sft_generation(**params)
    assert (again["skipped"], again["tasks"], again["accepted"]) == (1, 1, 0)  # "solved" is not run again


def test_a_bad_dataset_is_refused_with_the_row_named(tmp_path):
    bad = write_dataset(tmp_path / "bad.jsonl", [{"id": "a", "instruction": "x"}, {"instruction": "no id"}])
    with pytest.raises(InvalidRequest) as error:
        load_dataset(bad)
    assert error.value.field == "dataset.1.id"
    with pytest.raises(InvalidRequest):
        load_dataset(tmp_path / "missing.jsonl")
