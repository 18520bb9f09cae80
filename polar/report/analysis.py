"""Analysis as pandas DataFrames, read from the store's SQL views (``db.views``) and tables.

    from polar.report.analysis import rewards_by, merge_ratio, stage_latencies, failure_causes, rollouts
    rewards_by(factory, "harness", "weight_version")

``since``/``until`` restrict to rollouts created in ``[since, until)``; ``task_ids`` to some tasks. Each function
returns an empty frame with the right columns when nothing matches.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import pandas as pd
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from polar.errors import InvalidRequest

REWARD_KEYS = ("harness", "task_name", "weight_version")
STAGE_COLUMNS = ("init_s", "run_s", "postrun_s", "evaluate_s")


def _read(factory: sessionmaker[Session], sql: str, params: dict[str, Any]) -> pd.DataFrame:
    with factory() as db:
        return pd.read_sql(sa.text(sql), db.connection(), params=params)


def _where(
    since: datetime | None, until: datetime | None, task_ids: Sequence[str] | None, prefix: str = ""
) -> tuple[str, dict[str, Any]]:
    clauses: list[str] = []
    params: dict[str, Any] = {}
    if since is not None:
        clauses.append(f"{prefix}created_at >= :since")
        params["since"] = since
    if until is not None:
        clauses.append(f"{prefix}created_at < :until")
        params["until"] = until
    if task_ids is not None:
        names = [f"t{i}" for i in range(len(task_ids))]
        clauses.append(f"{prefix}task_id IN ({', '.join(':' + n for n in names)})" if names else "1 = 0")
        params.update(zip(names, task_ids, strict=True))
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def rollouts(
    factory: sessionmaker[Session],
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    task_ids: Sequence[str] | None = None,
) -> pd.DataFrame:
    """One row per rollout (``rollout_facts``)."""
    where, params = _where(since, until, task_ids)
    frame = _read(factory, f"SELECT * FROM rollout_facts{where} ORDER BY created_at, rollout_id", params)
    return frame.astype({c: "float64" for c in STAGE_COLUMNS})


def rewards_by(
    factory: sessionmaker[Session],
    *keys: str,
    since: datetime | None = None,
    until: datetime | None = None,
    task_ids: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Mean reward, counts and solved by any of harness, task_name, weight_version (in version order)."""
    keys = keys or ("harness",)
    bad = [k for k in keys if k not in REWARD_KEYS]
    if bad:
        raise InvalidRequest(f"cannot group rewards by {bad}; choose from {', '.join(REWARD_KEYS)}", field="keys")
    frame = rollouts(factory, since=since, until=until, task_ids=task_ids)
    frame = frame[frame["status"].isin(["COMPLETED", "ERROR", "TIMEOUT"])].rename(
        columns={"weight_version_min": "weight_version"}
    )
    frame["solved"] = (frame["reward"] >= 1).astype(int)
    frame["version_order"] = frame["version_id"].fillna(0)
    frame["weight_version"] = frame["weight_version"].fillna("(no captures)")
    out = (
        frame.groupby(list(keys), dropna=False)
        .agg(
            rollouts=("rollout_id", "count"),
            mean_reward=("reward", "mean"),
            solved=("solved", "sum"),
            version_order=("version_order", "min"),
        )
        .reset_index()
    )
    order = (["version_order"] if "weight_version" in keys else []) + list(keys)
    return out.sort_values(order).drop(columns="version_order").reset_index(drop=True)


def token_counts(factory: sessionmaker[Session], *, task_ids: Sequence[str] | None = None) -> pd.DataFrame:
    where, params = _where(None, None, task_ids)
    return _read(factory, f"SELECT * FROM token_counts{where}", params)


def merge_ratio(factory: sessionmaker[Session]) -> pd.DataFrame:
    """Captures per merged trace and the conditioning-exact rate, by harness and builder."""
    return _read(factory, "SELECT * FROM merge_ratio ORDER BY harness, builder", {})


def stage_latencies(
    factory: sessionmaker[Session],
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    task_ids: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Mean and max seconds of each stage, by harness."""
    frame = rollouts(factory, since=since, until=until, task_ids=task_ids)
    grouped = frame.groupby("harness", dropna=False)[list(STAGE_COLUMNS)]
    return grouped.mean().add_suffix("_mean").join(grouped.max().add_suffix("_max")).reset_index()


def failure_causes(
    factory: sessionmaker[Session],
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    task_ids: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Failed, timed-out and cancelled rollouts by harness, status, stage and error text, most frequent first."""
    frame = rollouts(factory, since=since, until=until, task_ids=task_ids)
    frame = frame[frame["status"].isin(["ERROR", "TIMEOUT", "CANCELLED"])].copy()
    frame["failed_stage"] = frame["failed_stage"].fillna("-")
    frame["cause"] = frame["error"].fillna("(no error text)").str.slice(0, 120)
    out = (
        frame.groupby(["harness", "status", "failed_stage", "cause"], dropna=False).size().reset_index(name="rollouts")
    )
    return out.sort_values("rollouts", ascending=False).reset_index(drop=True)
