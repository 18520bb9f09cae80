"""The shape of ``rollouts.stage_timings``: per stage, when it started and finished, how long it took, how many
attempts it has had and where the last one ran.

The column holds ``{stage: {"started_at", "attempts", "where", "finished_at", "duration_s"}}`` (times as ISO 8601
strings; the SQL views read ``duration_s``). ``StageTimings.of`` reads it once; the accessors answer what the
pipeline and the pages ask (``started_at``, ``finished``, ``spent_s``) instead of ``.get()`` chains, and a
stage's timing is written back as ``StageTiming.as_json()`` (``begun``, ``ended``), so the JSON stays as it was.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from db.stage_reports import StoredRecord


class StageHost(StoredRecord):
    """Where a stage attempt ran: the host, the flow process and its parent (the worker that started it)."""

    host: str
    pid: int
    ppid: int

    def __str__(self) -> str:
        return " ".join(f"{key}={value}" for key, value in self.as_json().items())


class StageTiming(StoredRecord):
    """One stage's timing. A stage is done once ``finished_at`` is set."""

    started_at: str | None = None
    attempts: int = 0
    where: StageHost | None = None
    finished_at: str | None = None
    duration_s: float | None = None

    @property
    def started(self) -> datetime | None:
        return datetime.fromisoformat(self.started_at) if self.started_at else None

    @property
    def finished(self) -> bool:
        return bool(self.finished_at)

    def begun(self, at: datetime, where: StageHost) -> StageTiming:
        """This timing as a new attempt starting at ``at`` records it."""
        return self.model_copy(update={"started_at": at.isoformat(), "attempts": self.attempts + 1, "where": where})

    def ended(self, at: datetime) -> StageTiming:
        """This timing as the attempt finishing at ``at`` records it (its duration from ``started_at``)."""
        started = self.started or at
        return self.model_copy(
            update={"finished_at": at.isoformat(), "duration_s": round((at - started).total_seconds(), 4)}
        )


_NOT_STARTED = StageTiming()
STAGE_NAMES = ("init", "run", "postrun", "evaluate")


class StageTimings(StoredRecord):
    """The ``stage_timings`` column, by stage name."""

    init: StageTiming | None = None
    run: StageTiming | None = None
    postrun: StageTiming | None = None
    evaluate: StageTiming | None = None

    @classmethod
    def of(cls, stored: Mapping[str, Any] | None) -> StageTimings:
        return cls.model_validate(stored or {})

    def stage(self, name: str) -> StageTiming:
        """``name``'s timing; an empty one (not started) when it has none."""
        timing = getattr(self, name, None)
        return timing if isinstance(timing, StageTiming) else _NOT_STARTED

    def started_at(self, name: str) -> datetime | None:
        """When ``name``'s latest attempt started, if it has started."""
        return self.stage(name).started

    def finished(self, name: str) -> bool:
        return self.stage(name).finished

    def spent_s(self, names: Iterable[str]) -> float:
        """Seconds the finished attempts of the ``names`` stages took, in all."""
        return sum(self.stage(name).duration_s or 0.0 for name in names)

    @property
    def total_s(self) -> float:
        """Seconds the finished attempts of every stage took, in all."""
        return self.spent_s(STAGE_NAMES)
