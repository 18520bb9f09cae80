"""The report's four plots, each from one analysis frame, written as PNG (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

STAGES = ("init", "run", "postrun", "evaluate")


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_xticks([])
    ax.set_yticks([])


def reward_over_versions(frame: pd.DataFrame, path: Path) -> Path:
    """``frame``: rewards_by(harness, weight_version), in version order."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    if frame.empty:
        _empty(ax, "no finished rollouts")
    for harness, rows in frame.groupby("harness", dropna=False, sort=False):
        labels = [str(v) for v in rows["weight_version"]]
        ax.plot(labels, rows["mean_reward"], marker="o", label=str(harness))
    if not frame.empty:
        ax.set_ylim(-0.05, 1.05)
        ax.legend(fontsize=8)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    ax.set(title="Mean reward by weight version", xlabel="weight version (registration order)", ylabel="mean reward")
    return _save(fig, path)


def merge_ratio(frame: pd.DataFrame, path: Path) -> Path:
    """``frame``: the merge_ratio view."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    frame = frame[frame["builder"] == "prefix_merge"] if not frame.empty else frame
    if frame.empty or frame["merge_ratio"].isna().all():
        _empty(ax, "no prefix-merged trajectories")
    else:
        bars = ax.bar(frame["harness"].astype(str), frame["merge_ratio"].fillna(0), color="#4c72b0")
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
    ax.set(title="Captures per merged trajectory (prefix_merge)", xlabel="harness", ylabel="merge ratio")
    return _save(fig, path)


def stage_latency(frame: pd.DataFrame, path: Path) -> Path:
    """``frame``: stage_latencies (``<stage>_s_mean`` columns by harness)."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    if frame.empty:
        _empty(ax, "no rollouts")
    else:
        left = pd.Series(0.0, index=frame.index)
        names = frame["harness"].astype(str)
        for stage in STAGES:
            values = frame[f"{stage}_s_mean"].fillna(0.0)
            ax.barh(names, values, left=left, label=stage)
            left = left + values
        ax.legend(fontsize=8)
    ax.set(title="Mean stage latency", xlabel="seconds", ylabel="harness")
    return _save(fig, path)


def failure_causes(frame: pd.DataFrame, path: Path, top: int = 10) -> Path:
    """``frame``: failure_causes, most frequent first."""
    fig, ax = plt.subplots(figsize=(8, 3.8))
    if frame.empty:
        _empty(ax, "no failed, timed-out or cancelled rollouts")
    else:
        rows = frame.head(top).iloc[::-1]
        labels = [
            f"{r.status}{'' if r.failed_stage == '-' else ' in ' + r.failed_stage}: {str(r.cause)[:50]}"
            for r in rows.itertuples()
        ]
        ax.barh(labels, rows["rollouts"], color="#c44e52")
        ax.tick_params(axis="y", labelsize=7)
    ax.set(title="Failure causes", xlabel="rollouts")
    return _save(fig, path)
