"""What an alarm is: its kind, what it is about (a batch, a weight version, a gateway) and why it fired."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class AlarmKind(StrEnum):
    ALL_ZERO_REWARD = "all_zero_reward"  # every finished group of a batch or weight version scored 0
    ALL_ONE_REWARD = "all_one_reward"  # ... or 1: nothing left to learn from
    EMPTY_PATCHES = "empty_patches"  # git rollouts whose agent changed nothing
    NO_MODEL_CALL = "no_model_call"  # harness runs that ended without one model call
    INFRA_ERRORS = "infra_errors"  # rollouts that failed in the pipeline, not in the agent's work
    GATEWAY_SILENT = "gateway_silent"  # a registered gateway past its heartbeat window


@dataclass(frozen=True)
class Alarm:
    """One alarm. ``scope`` names what it is about (``batch``, ``version v3``, ``gateway host:port``); ``value``
    is what was measured against ``threshold`` (a share, a count of groups, seconds of silence)."""

    kind: AlarmKind
    scope: str
    message: str
    value: float
    threshold: float
    task_ids: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "scope": self.scope,
            "message": self.message,
            "value": self.value,
            "threshold": self.threshold,
            "task_ids": list(self.task_ids),
        }
