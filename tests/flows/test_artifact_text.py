"""The rollout artifact's markdown: the failure cause of a failed rollout, and the /ui link only when a public
URL is configured (what the Prefect API returns for real runs is checked in test_flows)."""

from __future__ import annotations

from flows.artifacts import rollout_markdown, rollout_url
from polar.settings import Settings
from polar.ui.listing import RolloutItem


def item(**changes) -> RolloutItem:
    values = dict(
        rollout_id="r1",
        task_id="t1",
        task="fix-bug",
        sample=3,
        harness="codex",
        group=None,
        status="ERROR",
        reward=0.0,
        captures=5,
        traces=2,
        trainable_tokens=0,
        version_min="v7",
        version_max="v8",
        seconds=12.0,
        created_at=None,
        error="the harness exited with code -9: Killed\nmore output",
    )
    values.update(changes)
    return RolloutItem(**values)


def test_a_failed_rollout_names_its_cause_and_links_only_with_a_public_url(tmp_path):
    text = rollout_markdown(item(), rollout_url(Settings(home=tmp_path), "r1"))
    assert "### Rollout `r1`: ERROR" in text
    assert "| fix-bug | 3 | codex | ERROR | 0.00 | 5 | 2 | 0 | v7 |" in text
    assert "**Failure cause:** the harness exited with code -9: Killed" in text and "more output" not in text
    assert "/ui/" not in text
    linked = rollout_markdown(item(error=None), rollout_url(Settings(home=tmp_path, public_url="https://p.io/"), "r1"))
    assert "Failure cause" not in linked and "[Open it in the Polar UI](https://p.io/ui/rollouts/r1)" in linked
