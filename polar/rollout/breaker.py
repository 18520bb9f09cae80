"""A batch's circuit breaker: stop after N consecutive infrastructure errors.

An infrastructure error is a rollout that failed a stage for good (after that stage's retries): an image that
does not build, a verifier that crashes or times out, a runtime that cannot start. Those say nothing about the
policy (the rollout is ERROR with its cause, never a reward of 0), and when N of them come in a row the rest of
the batch would most likely fail the same way, so the batch stops: rollouts not yet started are cancelled with
the breaker's message, and the batch raises ``BatchStopped``. A rollout that finishes (whatever its reward, or a
harness that crashed, which is an outcome) resets the count. ``limit`` 0 never trips.
"""

from __future__ import annotations

from polar.errors import BatchStopped


class CircuitBreaker:
    def __init__(self, limit: int):
        self.limit = limit
        self.consecutive = 0
        self.last_error: str | None = None
        self.tripped = False

    def record(self, error: str | None) -> None:
        """One rollout's end: ``error`` when it failed a stage for good, None when it finished."""
        if error is None:
            self.consecutive = 0
            return
        self.consecutive += 1
        self.last_error = error
        if self.limit and self.consecutive >= self.limit:
            self.tripped = True

    def message(self, cancelled: int) -> str:
        return (
            f"batch stopped: {self.consecutive} rollouts in a row failed for infrastructure reasons "
            f"(POLAR_BATCH_MAX_CONSECUTIVE_ERRORS={self.limit}); {cancelled} unstarted rollout(s) cancelled; "
            f"last error: {self.last_error}"
        )

    def error(self, cancelled: int) -> BatchStopped:
        return BatchStopped(self.message(cancelled), field="batch")
