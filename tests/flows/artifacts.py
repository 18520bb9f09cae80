"""Checks of the Prefect artifacts a batch leaves (read back through the Prefect API): each rollout flow run
has a markdown artifact with its outcome and its /ui link, the batch flow run a table with one row per rollout."""

from __future__ import annotations

import json
from typing import Any

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

from tests.flows.prefect_api import flow_runs_named
from tests.rollout.helpers import rollout_row

PUBLIC_URL = "http://polar.example:8800/"


async def artifacts_of(flow_run_id) -> list[Any]:
    async with get_client() as client:
        return await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )


def _rows(artifact) -> list[dict[str, Any]]:
    data = json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data
    return data if isinstance(data, list) else []  # other artifacts of the run (not a table) hold no rows


async def check_artifacts(factory, summary: dict[str, Any], names: dict[str, str]) -> None:
    """``summary`` is what ``rollout_batch`` returned (run with ``POLAR_PUBLIC_URL=PUBLIC_URL``); ``names`` maps
    each task id to its name."""
    rewards = {}
    for task_id, rollout_ids in summary["tasks"].items():
        for rid in rollout_ids:
            row = rollout_row(factory, rid)
            rewards[rid] = row.reward
            (artifact,) = await artifacts_of(row.flow_run_id)
            assert artifact.key == f"rollout-{rid}" and artifact.type == "markdown"
            text = artifact.data
            assert f"Rollout `{rid}`: {row.status.value}" in text
            cells = f"| {names[task_id]} | {row.sample_index} | agent | {row.status.value} | {row.reward:.2f} | 2 | 1 |"
            assert cells in text, text
            assert f"({PUBLIC_URL}ui/rollouts/{rid})" in text
    tables = [  # a batch flow run may also carry an alarms artifact (markdown)
        a for run in await flow_runs_named("batch-inline") for a in await artifacts_of(run.id) if a.key == "polar-batch"
    ]
    (table,) = [t for t in tables if {r["rollout"] for r in _rows(t)} == set(rewards)]  # one batch per store
    assert table.type == "table" and table.key == "polar-batch"
    rows = _rows(table)
    assert {r["rollout"]: r["reward"] for r in rows} == rewards
    assert all(
        r["captures"] == 2 and r["traces"] == 1 and r["trainable_tokens"] == 0 for r in rows
    )  # scripted: never trains
    assert all(r["ui"] == f"{PUBLIC_URL}ui/rollouts/{r['rollout']}" for r in rows)
