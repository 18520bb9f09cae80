"""Learning curves from the store (by weight version in registration order and by task group), the SVG charts
drawn from them, and ``polar report`` embedding them; on SQLite and Postgres."""

from __future__ import annotations

import re

import pytest

from db.migrate import upgrade
from polar.live import curve_charts, learning_curves
from polar.live.svg import line_chart
from polar.report.build import build_report
from polar.rollout.context import store_factory
from tests.live.seed import VERSIONS, seed_rising
from tests.pg import migrated_store
from tests.rollout.helpers import test_settings


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_curves_by_version_and_group_follow_the_rewards(kind, tmp_path, cache_dir):
    with migrated_store(kind, tmp_path) as url:
        factory = store_factory(test_settings(tmp_path, cache_dir, url))
        expected = seed_rising(factory)
        with factory() as db:
            curves = learning_curves(db)
        assert curves.versions == VERSIONS and curves.groups == ["arith", "files"]
        assert curves.series("mean_reward") == expected
        assert curves.series("solve_rate") == expected  # rewards are 0 or 1
        assert curves.series("trainable_tokens")["all"] == [40.0, 50.0, 60.0, 70.0, 80.0]
        assert curves.series("duration_s")["files"] == [21.0, 19.0, 17.0, 15.0, 13.0]
        assert curves.rollouts["all"][VERSIONS[0]] == 16
        charts = curve_charts(curves)
        assert set(charts) == {"mean_reward", "solve_rate", "trainable_tokens", "duration_s"}
        points = re.findall(r'data-series="all" data-x="([^"]+)" data-y="([^"]+)"', charts["mean_reward"])
        assert [(x, float(y)) for x, y in points] == list(zip(VERSIONS, expected["all"], strict=True))
        report = build_report(factory, tmp_path / "report")
        page = report.html.read_text()
        assert page.count("<svg") == 4 and 'data-series="arith"' in page
        assert report.charts["mean_reward"].read_text() == charts["mean_reward"]


def test_an_empty_store_and_gaps_and_escaping(tmp_path, cache_dir):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    upgrade(url)
    factory = store_factory(test_settings(tmp_path, cache_dir, url))
    with factory() as db:
        curves = learning_curves(db)
    assert curves.versions == [] and "no finished rollouts" in curve_charts(curves)["mean_reward"]
    svg = line_chart("<b>", ["v<1>", "v2", "v3"], {"a&b": [1.0, None, 3.0]})
    assert "<b>" not in svg and "&lt;b&gt;" in svg and "a&amp;b" in svg and "v&lt;1&gt;" in svg
    assert svg.count("<circle") == 2 and "<polyline" not in svg  # a gap breaks the line: no segment of two
