"""Building a report: the analysis frames of a run or a date range, four PNG plots, the learning curves (mean
reward, solve rate, trainable tokens, duration by weight version and task group; SVG drawn by ``polar.live``,
the same charts as the live page), and an HTML page that embeds them (PNG as base64, SVG inline) with summary
tables, so the page is one file to share."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pandas as pd
from sqlalchemy.orm import Session, sessionmaker

from polar.live import curve_charts, learning_curves
from polar.report import analysis, plots


@dataclass(frozen=True)
class Report:
    html: Path
    images: dict[str, Path]
    summary: dict[str, object]
    charts: dict[str, Path] = field(default_factory=dict)  # the learning curves, SVG


def _summary(rollouts: pd.DataFrame, tokens: pd.DataFrame) -> dict[str, object]:
    statuses = rollouts["status"].value_counts().to_dict() if not rollouts.empty else {}
    rewards = rollouts["reward"].dropna()
    return {
        "rollouts": int(len(rollouts)),
        "statuses": {str(k): int(v) for k, v in statuses.items()},
        "tasks": int(rollouts["task_id"].nunique()) if not rollouts.empty else 0,
        "mean_reward": round(float(rewards.mean()), 4) if len(rewards) else None,
        "captures": int(tokens["captures"].sum()) if not tokens.empty else 0,
        "output_tokens": int(tokens["output_tokens"].sum()) if not tokens.empty else 0,
        "first": str(rollouts["created_at"].min()) if not rollouts.empty else None,
        "last": str(rollouts["created_at"].max()) if not rollouts.empty else None,
    }


def build_report(
    factory: sessionmaker[Session],
    out: Path,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    task_ids: list[str] | None = None,
    title: str = "Polar report",
) -> Report:
    """Write ``out``/report.html and its PNGs for the rollouts created in [since, until) (or of ``task_ids``)."""
    out.mkdir(parents=True, exist_ok=True)
    rollouts = analysis.rollouts(factory, since=since, until=until, task_ids=task_ids)
    tokens = analysis.token_counts(
        factory, task_ids=list(rollouts["task_id"].dropna().unique()) if task_ids or since or until else None
    )
    rewards = analysis.rewards_by(factory, "harness", "weight_version", since=since, until=until, task_ids=task_ids)
    merges = analysis.merge_ratio(factory)
    if not rollouts.empty and not merges.empty:
        merges = merges[merges["harness"].isin(rollouts["harness"].dropna().unique())]
    latencies = analysis.stage_latencies(factory, since=since, until=until, task_ids=task_ids)
    failures = analysis.failure_causes(factory, since=since, until=until, task_ids=task_ids)
    images = {
        "reward_over_versions": plots.reward_over_versions(rewards, out / "reward_over_versions.png"),
        "merge_ratio": plots.merge_ratio(merges, out / "merge_ratio.png"),
        "stage_latency": plots.stage_latency(latencies, out / "stage_latency.png"),
        "failure_causes": plots.failure_causes(failures, out / "failure_causes.png"),
    }
    with factory() as db:
        svgs = curve_charts(learning_curves(db, since=since, until=until, task_ids=task_ids))
    charts = {}
    for name, svg in svgs.items():
        charts[name] = out / f"curve_{name}.svg"
        charts[name].write_text(svg, encoding="utf-8")
    summary = _summary(rollouts, tokens)
    page = out / "report.html"
    scope = {"since": since, "until": until, "task_ids": task_ids}
    scope_text = ", ".join(f"{k}={v}" for k, v in scope.items() if v) or "everything in the store"
    page.write_text(_html(title, scope_text, summary, images, svgs, rewards, latencies, failures), encoding="utf-8")
    return Report(page, images, summary, charts)


def _html(
    title: str,
    scope_text: str,
    summary: dict[str, object],
    images: dict[str, Path],
    svgs: dict[str, str],
    rewards: pd.DataFrame,
    latencies: pd.DataFrame,
    failures: pd.DataFrame,
) -> str:
    def table(frame: pd.DataFrame) -> str:
        return (
            frame.to_html(index=False, float_format=lambda v: f"{v:.3f}", na_rep="", border=0)
            if not frame.empty
            else "<p>none</p>"
        )

    def image(name: str, path: Path) -> str:
        data = base64.b64encode(path.read_bytes()).decode()
        return f'<figure><img alt="{name}" src="data:image/png;base64,{data}"><figcaption>{name}</figcaption></figure>'

    items = "".join(f"<li><b>{html.escape(str(k))}</b>: {html.escape(str(v))}</li>" for k, v in summary.items())
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:1000px;margin:2em auto}} img{{max-width:100%}}
table{{border-collapse:collapse;font-size:12px}} td,th{{padding:2px 8px;border-bottom:1px solid #ddd}}</style></head>
<body><h1>{html.escape(title)}</h1><p>Scope: {html.escape(scope_text)}</p><ul>{items}</ul>
<h2>Learning curves</h2><div class="curves">{"".join(svgs.values())}</div>
{"".join(image(name, path) for name, path in images.items())}
<h2>Rewards by harness and weight version</h2>{table(rewards)}
<h2>Stage latencies (s)</h2>{table(latencies)}
<h2>Failure causes</h2>{table(failures)}
</body></html>"""
