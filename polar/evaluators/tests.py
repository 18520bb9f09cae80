"""The ``tests`` evaluator: run a pytest-style test command and reward the result.

Test files can be written into the working folder first (``files``), so the agent never saw them. The summary
line (``3 passed, 1 failed``) is parsed; ``mode: all`` rewards 1 only when something passed and nothing failed,
``mode: fraction`` rewards passed / (passed + failed + errors). Exit codes follow pytest: 0 all passed, 1 some
failed; anything else (interrupted, internal error, usage error, no tests collected) is an evaluation error,
never a 0, because the tests did not really run.
"""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from polar.errors import EvaluationError
from polar.evaluators.base import EvalContext, EvalResult

_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)")


def parse_summary(output: str) -> dict[str, int]:
    """Counts from pytest's last summary line (``== 2 passed, 1 failed in 0.1s ==`` or ``2 passed in 0.1s``)."""
    for line in reversed(output.strip().splitlines()):
        found = _COUNT.findall(line)
        if found:
            counts: dict[str, int] = {}
            for number, word in found:
                key = "errors" if word.startswith("error") else word
                counts[key] = counts.get(key, 0) + int(number)
            return counts
    return {}


class TestsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: str = Field(default="{python} -m pytest -q -p no:cacheprovider", min_length=1)
    files: dict[str, str] = Field(default_factory=dict, description="test files written before the run")
    mode: Literal["all", "fraction"] = "all"
    env: dict[str, str] = Field(default_factory=dict)


class TestsEvaluator:
    name: ClassVar[str] = "tests"
    Config: ClassVar[type[BaseModel]] = TestsConfig

    async def evaluate(self, config: TestsConfig, ctx: EvalContext) -> EvalResult:
        for path, content in config.files.items():
            await ctx.runtime.write_file(path, content)
        result = await ctx.runtime.exec(ctx.fill(config.command), env=config.env, timeout_s=ctx.timeout_s)
        if result.timed_out:
            raise EvaluationError(f"the test command timed out after {ctx.timeout_s:g} s")
        if result.returncode not in (0, 1):
            raise EvaluationError(
                f"the test command ended with exit code {result.returncode}: {result.stdout[-300:].strip()}"
            )
        counts = parse_summary(result.stdout)
        passed, failed = counts.get("passed", 0), counts.get("failed", 0) + counts.get("errors", 0)
        if not counts:  # a pytest-style command without pytest's summary: its exit code decides
            reward = 1.0 if result.returncode == 0 else 0.0
        elif config.mode == "all":
            reward = 1.0 if passed > 0 and failed == 0 and result.returncode == 0 else 0.0
        else:
            reward = passed / (passed + failed) if passed + failed else 0.0
        details = {**result.summary(), "counts": counts, "output": result.stdout[-2000:]}
        return EvalResult(reward, details)
