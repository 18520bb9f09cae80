"""The SQL views and ``polar.report.analysis`` frames agree with the rows they summarise; ``polar report`` renders."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from polar.errors import InvalidRequest
from polar.report import analysis
from polar.report.build import build_report

PNG = b"\x89PNG\r\n\x1a\n"


def test_rollout_facts_and_rewards(store_context, batch, crashed):
    facts = analysis.rollouts(store_context.factory)
    assert len(facts) == 5 and set(facts["harness"]) == {"agent", "command"}
    done = facts[facts["status"] == "COMPLETED"]
    assert len(done) == 4 and (done["run_s"] > 0).all() and (done["evaluate_s"] >= 0).all()
    rewards = analysis.rewards_by(store_context.factory, "harness", "task_name")
    agent = rewards[rewards["harness"] == "agent"].set_index("task_name")
    assert agent.loc["export-a", "rollouts"] == 2 and agent.loc["export-a", "mean_reward"] == 0.5
    assert agent.loc["export-a", "solved"] == 1
    with pytest.raises(InvalidRequest):
        analysis.rewards_by(store_context.factory, "colour")


def test_views_answer_the_documented_queries(store_context, batch, crashed):
    with store_context.factory() as db:
        by_version = db.execute(
            sa.text(
                "SELECT harness, weight_version, SUM(rollouts) AS n, AVG(mean_reward) AS reward FROM "
                "rewards_by_harness_task_version"
                " GROUP BY harness, weight_version, version_id ORDER BY harness, version_id"
            )
        ).all()
        assert ("agent", "default", 4, 0.5) in [tuple(r) for r in by_version]
        tokens = db.execute(
            sa.text("SELECT task_name, SUM(captures), SUM(output_tokens) FROM token_counts GROUP BY task_name")
        ).all()
        assert {name: calls for name, calls, _ in tokens}["export-a"] == 4  # two turns per sample
        merges = db.execute(
            sa.text(
                "SELECT harness, builder, captures_in, traces_out, merge_ratio FROM merge_ratio WHERE harness = 'agent'"
            )
        ).one()
        assert (
            merges.builder == "prefix_merge"
            and merges.captures_in == 8
            and merges.traces_out == 4
            and merges.merge_ratio == 2.0
        )
        causes = db.execute(sa.text("SELECT harness, status, cause, rollouts FROM failure_causes")).all()
        assert [(c.harness, c.status, c.rollouts) for c in causes] == [("command", "ERROR", 1)]
    assert analysis.merge_ratio(store_context.factory).loc[0, "exact_rate"] == 1.0
    failures = analysis.failure_causes(store_context.factory)
    assert failures.loc[0, "status"] == "ERROR" and failures.loc[0, "rollouts"] == 1
    latencies = analysis.stage_latencies(store_context.factory).set_index("harness")
    assert latencies.loc["agent", "run_s_mean"] > 0


def test_date_and_task_scopes(store_context, batch, crashed):
    later = datetime.now(UTC) + timedelta(hours=1)
    assert analysis.rollouts(store_context.factory, since=later).empty
    assert analysis.rewards_by(store_context.factory, since=later).empty
    assert len(analysis.rollouts(store_context.factory, task_ids=batch[:1])) == 2
    assert len(analysis.rollouts(store_context.factory, until=later)) == 5


def test_report_renders_pngs_and_a_self_contained_page(store_context, batch, crashed, tmp_path):
    report = build_report(store_context.factory, tmp_path / "report")
    assert set(report.images) == {"reward_over_versions", "merge_ratio", "stage_latency", "failure_causes"}
    for path in report.images.values():
        data = path.read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, path
    page = report.html.read_text()
    assert page.count("data:image/png;base64,") == 4 and "<td>agent</td>" in page and "exited with code 3" in page
    assert report.summary["rollouts"] == 5 and report.summary["statuses"] == {"COMPLETED": 4, "ERROR": 1}
    empty = build_report(store_context.factory, tmp_path / "empty", since=datetime.now(UTC) + timedelta(hours=1))
    assert empty.summary["rollouts"] == 0 and all(p.read_bytes().startswith(PNG) for p in empty.images.values())


def test_export_and_report_commands(store_context, batch, crashed, tmp_path, monkeypatch, capsys):
    import json

    from polar.cli import main
    from polar.settings import get_settings

    monkeypatch.setenv("POLAR_DATABASE_URL", store_context.settings.resolved_database_url)
    monkeypatch.setenv("POLAR_HOME", str(tmp_path))
    monkeypatch.setenv("POLAR_CACHE", str(store_context.settings.cache_dir))
    get_settings.cache_clear()
    try:
        scripted = "--include-scripted"  # the fixtures are scripted rollouts, which exports leave out by default
        assert (
            main(["export", str(tmp_path / "sft.jsonl"), "--kind", "sft", "--accepted", "--task", batch[0], scripted])
            == 0
        )
        assert json.loads(capsys.readouterr().out)["rows"] == 1
        assert main(["export", str(tmp_path / "rl.parquet"), "--harness", "agent", "--max-reward", "0", scripted]) == 0
        assert json.loads(capsys.readouterr().out)["rows"] == 2
        assert main(["report", "--out", str(tmp_path / "r"), "--task", batch[1]]) == 0
        assert json.loads(capsys.readouterr().out)["rollouts"] == 2
        assert main(["export", str(tmp_path / "x.jsonl"), "--since", "yesterday"]) == 2
        assert "not an ISO date" in capsys.readouterr().err
    finally:
        get_settings.cache_clear()
