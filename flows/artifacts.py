"""Prefect artifacts, so the Prefect UI shows outcomes without leaving it: a markdown artifact on each rollout
flow run (status, reward, captures, traces, trainable tokens, failure cause, a link to the rollout's ``/ui``
page when ``POLAR_PUBLIC_URL`` is set) and a table artifact on each batch flow run (one row per rollout).

The numbers are the web UI's own read model (``polar.ui.listing``), read from the store after the rollout
finished. Publishing is best effort: an artifact is a view, the store is the truth, so a Prefect API hiccup
is logged and never fails a rollout that succeeded.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact
from sqlalchemy.orm import Session, sessionmaker

from polar.settings import Settings
from polar.ui.listing import RolloutFilter, RolloutItem, list_rollouts

log = logging.getLogger(__name__)


def rollout_url(settings: Settings, rollout_id: str) -> str | None:
    base = settings.public_url.rstrip("/")
    return f"{base}/ui/rollouts/{rollout_id}" if base else None


def load_items(factory: sessionmaker[Session], rollout_ids: Sequence[str]) -> list[RolloutItem]:
    with factory() as db:
        page = list_rollouts(db, RolloutFilter(rollout_ids=tuple(rollout_ids)), limit=len(rollout_ids), offset=0)
    order = {rid: i for i, rid in enumerate(rollout_ids)}
    return sorted(page.items, key=lambda item: order.get(item.rollout_id, 0))


def _reward(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def rollout_markdown(item: RolloutItem, url: str | None) -> str:
    """The rollout flow run's artifact: a small table of its outcome, the failure if any, and its UI link."""
    lines = [
        f"### Rollout `{item.rollout_id}`: {item.status}",
        "",
        "| task | sample | harness | status | reward | captures | traces | trainable tokens | weights |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {item.task} | {item.sample} | {item.harness or '–'} | {item.status} | {_reward(item.reward)} | "
        f"{item.captures} | {item.traces} | {item.trainable_tokens} | {item.version_min or '–'} |",
        "",
    ]
    if item.error:
        cause = item.error.strip().splitlines()[0][:300]
        lines += [f"**Failure cause:** {cause}", ""]
    if url:
        lines.append(f"[Open it in the Polar UI]({url})")
    return "\n".join(lines)


def batch_table(items: Sequence[RolloutItem], settings: Settings) -> list[dict[str, Any]]:
    return [
        {
            "task": item.task,
            "sample": item.sample,
            "rollout": item.rollout_id,
            "status": item.status,
            "reward": item.reward,
            "captures": item.captures,
            "traces": item.traces,
            "trainable_tokens": item.trainable_tokens,
            "error": (item.error or "").splitlines()[0][:120] if item.error else "",
            "ui": rollout_url(settings, item.rollout_id) or "",
        }
        for item in items
    ]


async def publish_rollout(factory: sessionmaker[Session], settings: Settings, rollout_id: str) -> None:
    """The markdown artifact of the current (rollout) flow run, keyed ``rollout-<id>``."""
    try:
        items = await asyncio.to_thread(load_items, factory, [rollout_id])
        if not items:
            return
        markdown = rollout_markdown(items[0], rollout_url(settings, rollout_id))
        await acreate_markdown_artifact(
            markdown, key=f"rollout-{rollout_id}", description=f"Polar rollout {rollout_id}"
        )
    except Exception:
        log.warning("could not publish the artifact of rollout %s", rollout_id, exc_info=True)


async def publish_batch(factory: sessionmaker[Session], settings: Settings, rollout_ids: Sequence[str]) -> None:
    """The table artifact of the current (batch) flow run: one row per rollout."""
    if not rollout_ids:
        return
    try:
        items = await asyncio.to_thread(load_items, factory, list(rollout_ids))
        await acreate_table_artifact(
            batch_table(items, settings), key="polar-batch", description=f"Polar batch of {len(items)} rollouts"
        )
    except Exception:
        log.warning("could not publish the batch artifact", exc_info=True)
