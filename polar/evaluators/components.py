"""An evaluation's reward components, typed: what the evaluator's free-form ``details`` say about how the reward
was reached, read the same way for the control API (``GET /v1/rollouts/{id}``) and the web UI's rollout page.

- ``harbor``: the verifier's named ``reward.json`` components (``named``), and which rule chose the scalar.
- ``swebench``: the resolution, FAIL_TO_PASS and PASS_TO_PASS counts (passed / failed, the failed tests
  named) and every test's outcome from the parsed log.
- ``tests``: pytest's summary counts (passed, failed, errors, ...).
Other evaluators (and details of an older shape) give an empty ``RewardComponents``: the details stay readable
as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field


class TestGroup(BaseModel):
    """FAIL_TO_PASS or PASS_TO_PASS of a SWE-bench report."""

    __test__ = False  # not a pytest class

    passed: int = 0
    failed: int = 0
    failed_tests: list[str] = Field(default_factory=list)


class RewardComponents(BaseModel):
    evaluator: str
    reward: float
    rule: str | None = Field(default=None, description="how the scalar was chosen (harbor: a component or mean)")
    named: dict[str, float] = Field(default_factory=dict, description="named numeric components (harbor)")
    counts: dict[str, int] = Field(default_factory=dict, description="tests by outcome: passed, failed, ...")
    resolution: str | None = Field(default=None, description="swebench: RESOLVED_FULL, RESOLVED_PARTIAL, ...")
    fail_to_pass: TestGroup | None = None
    pass_to_pass: TestGroup | None = None
    tests: dict[str, str] = Field(default_factory=dict, description="each test's outcome (swebench's log)")

    @property
    def empty(self) -> bool:
        return not (self.named or self.counts or self.resolution or self.tests)


def _group(report: Mapping[str, Any], key: str) -> TestGroup | None:
    part = report.get(key)
    if not isinstance(part, Mapping):
        return None
    success, failure = list(part.get("success") or []), [str(t) for t in part.get("failure") or []]
    return TestGroup(passed=len(success), failed=len(failure), failed_tests=failure)


def reward_components(evaluator: str, reward: float, details: Mapping[str, Any] | None) -> RewardComponents:
    """The components of one evaluation; never raises on unexpected details (they are only left out)."""
    details = details or {}
    out = RewardComponents(evaluator=evaluator, reward=reward)
    if evaluator == "harbor":
        named = details.get("components")
        if isinstance(named, Mapping):
            out.named = {str(k): float(v) for k, v in named.items() if isinstance(v, int | float)}
        out.rule = details.get("rule") if isinstance(details.get("rule"), str) else details.get("source")
    elif evaluator == "swebench":
        tests = details.get("tests_status")
        if isinstance(tests, Mapping):
            out.tests = {str(k): str(v) for k, v in tests.items()}
            for status in out.tests.values():
                key = status.lower()
                out.counts[key] = out.counts.get(key, 0) + 1
        if isinstance(details.get("resolution"), str):
            out.resolution = details["resolution"]
        report = details.get("report")
        if isinstance(report, Mapping):
            out.fail_to_pass = _group(report, "FAIL_TO_PASS")
            out.pass_to_pass = _group(report, "PASS_TO_PASS")
    elif evaluator == "tests":
        counts = details.get("counts")
        if isinstance(counts, Mapping):
            out.counts = {str(k): int(v) for k, v in counts.items() if isinstance(v, int)}
    return out
