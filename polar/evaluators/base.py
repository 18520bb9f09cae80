"""The evaluator contract: a rollout's outcome in, a reward in [0, 1] (and details) out.

An evaluator reads the rollout's runtime (the agent's own, or a fresh one prepared while the agent ran and
given the agent's changes), the postrun artifacts and the instruction. It returns an ``EvalResult`` or raises
``EvaluationError`` when it cannot give a reward it trusts (a crashed check, a timeout, an unparseable judge
verdict); the evaluate stage is then retried, it never records a made-up zero. Each evaluator has a pydantic
``Config`` (the ``config`` of a task's evaluator spec), validated when the task is submitted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel

from polar.runtime.base import Runtime


class ChatModel(Protocol):
    """One chat turn with a model (an LLM judge's way to ask)."""

    async def complete(self, messages: Sequence[tuple[str, str]], *, max_tokens: int, temperature: float) -> str:
        """The reply text to ``messages`` given as (role, content) pairs."""


@dataclass(frozen=True)
class EvalContext:
    rollout_id: str
    instruction: str
    runtime: Runtime
    timeout_s: float
    python: str  # an interpreter with this package's dependencies (pytest, ...) for {python} in commands
    artifacts: Mapping[str, Any] = field(default_factory=dict)  # postrun's: e.g. "diff"
    chat: ChatModel | None = None

    def fill(self, text: str) -> str:
        """``text`` with ``{python}`` and ``{workdir}`` replaced (other braces are the command's own)."""
        return text.replace("{python}", self.python).replace("{workdir}", str(self.runtime.layout.work))


@dataclass(frozen=True)
class EvalResult:
    reward: float
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.reward, bool) or not math.isfinite(self.reward) or not 0.0 <= self.reward <= 1.0:
            raise ValueError(f"a reward must be a finite number in [0, 1], not {self.reward!r}")


class Evaluator(Protocol):
    name: ClassVar[str]
    Config: ClassVar[type[BaseModel]]

    async def evaluate(self, config: Any, ctx: EvalContext) -> EvalResult: ...


def clamp_reward(value: float) -> float:
    return min(1.0, max(0.0, value))
