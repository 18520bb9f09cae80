"""``polar tasks check``: a dataset's tasks run with their oracle and with a no-op agent, then judged.

A task (a Harbor task with ``solution/solve.sh``, a SWE-bench instance with its gold ``patch``) is sound when its
oracle rollout is COMPLETED with reward 1 and its no-op rollout is COMPLETED with reward
0. Anything else is reported broken with the reason (an oracle scoring 0.5, a no-op that already passes, an
ERROR and its cause: an image that does not build, a verifier that crashes), so a broken task is found before
anyone trains on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from polar.report.rollouts import RolloutRow


class Checkable(Protocol):
    """A benchmark task with an oracle (a Harbor task, a SWE-bench instance)."""

    @property
    def task_id(self) -> str: ...

    def request(
        self, harness: dict[str, Any], *, samples: int = 1, policies: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]: ...

    def oracle_request(self) -> dict[str, Any]: ...

    def noop_request(self) -> dict[str, Any]: ...


ORACLE, NOOP = ":oracle", ":noop"


def check_requests(tasks: Sequence[Checkable]) -> list[dict[str, Any]]:
    """Two TaskRequests per task: its oracle and a no-op agent, one sample each."""
    requests: list[dict[str, Any]] = []
    for task in tasks:
        requests.extend((task.oracle_request(), task.noop_request()))
    return requests


@dataclass(frozen=True)
class Verdict:
    task_id: str
    oracle: str  # "1.00", "ERROR: cause", ...
    noop: str
    broken: list[str]

    @property
    def ok(self) -> bool:
        return not self.broken


def _outcome(row: RolloutRow | None) -> str:
    if row is None:
        return "missing"
    if row.status != "COMPLETED":  # the whole error: its hint (what to install, what to run) is the point
        return f"{row.status}: {row.error}" if row.error else row.status
    return f"{row.reward:.2f}" if row.reward is not None else "no reward"


def judge(tasks: Sequence[Checkable], rows: Sequence[RolloutRow]) -> list[Verdict]:
    by_name = {row.task: row for row in rows}
    verdicts = []
    for task in tasks:
        oracle, noop = by_name.get(task.task_id + ORACLE), by_name.get(task.task_id + NOOP)
        broken = []
        if oracle is None or oracle.status != "COMPLETED" or oracle.reward != 1.0:
            broken.append(f"oracle scored {_outcome(oracle)}, not 1")
        if noop is None or noop.status != "COMPLETED" or noop.reward != 0.0:
            broken.append(f"no-op scored {_outcome(noop)}, not 0")
        verdicts.append(Verdict(task.task_id, _outcome(oracle), _outcome(noop), broken))
    return verdicts


def format_verdicts(verdicts: Sequence[Verdict]) -> str:
    width = max([len(v.task_id) for v in verdicts] + [4])
    lines = [f"{'task':<{width}}  {'oracle':<8} {'no-op':<8} verdict"]
    for v in verdicts:
        verdict = "ok" if v.ok else "BROKEN: " + "; ".join(v.broken)
        lines.append(f"{v.task_id:<{width}}  {v.oracle[:8]:<8} {v.noop[:8]:<8} {verdict}")
    bad = sum(1 for v in verdicts if not v.ok)
    lines.append(f"{len(verdicts) - bad} of {len(verdicts)} tasks sound, {bad} broken")
    return "\n".join(lines)
