"""Status enums of the store's rows.

Values equal names, are upper case, and are stored as plain strings (see ``db.models``), so SQL filters read
``WHERE status = 'COMPLETED'``.
"""

from __future__ import annotations

from enum import StrEnum


class TaskStatus(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class RolloutStatus(StrEnum):
    """Where a rollout is: the four stages of its flow, then one terminal outcome."""

    PENDING = "PENDING"
    INIT = "INIT"
    RUNNING = "RUNNING"
    POSTRUN = "POSTRUN"
    EVALUATING = "EVALUATING"
    COMPLETED = "COMPLETED"
    ERROR = "ERROR"
    TIMEOUT = "TIMEOUT"
    CANCELLED = "CANCELLED"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL_ROLLOUT_STATUSES


_TERMINAL_ROLLOUT_STATUSES = frozenset(
    {RolloutStatus.COMPLETED, RolloutStatus.ERROR, RolloutStatus.TIMEOUT, RolloutStatus.CANCELLED}
)


class CaptureStatus(StrEnum):
    """Whether the backend call behind a capture succeeded; failed calls are kept for debugging.

    ``INTERRUPTED``: an OK call made by a harness launch that was cut short (its worker died) and launched again
    (``polar.rollout.stages.relaunch``). It is kept for the record, never trained on, never merged into the new
    launch's trajectories and never the parent of one of its calls.
    """

    OK = "OK"
    ERROR = "ERROR"
    INTERRUPTED = "INTERRUPTED"
    # The reply was committed but its caller never got it (a 503 after a store timeout, a client that left before
    # the last frame): kept for the record, never trained, never the parent of a later call.
    UNACKNOWLEDGED = "UNACKNOWLEDGED"


class Admission(StrEnum):
    """How the gateway admitted a call into its session's capture tree (``captures.admission``).

    ``root``: no earlier call explains it (``captures.admission_cause`` says why, for every root but the first);
    ``match``: it extends a committed call of the session token for token; ``unresolved``: its history holds
    assistant content no capture of the session produced in that context (an edited reply, an edited message
    before a reply, a reply whose commit failed). An unresolved call is served, but it and every call after it
    on its chain are poisoned: kept, shown, never trained.
    """

    ROOT = "root"
    MATCH = "match"
    UNRESOLVED = "unresolved"


class ClaimStatus(StrEnum):
    """A trainer's lease on a batch of groups: held, consumed (acknowledged), handed back, or timed out."""

    ACTIVE = "ACTIVE"
    ACKED = "ACKED"
    RELEASED = "RELEASED"
    EXPIRED = "EXPIRED"
