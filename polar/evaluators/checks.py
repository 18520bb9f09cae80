"""Evaluators that check the runtime after the agent ran.

- ``command``: reward 1 when a command exits 0, else 0 (a timeout is an evaluation error, not a 0).
- ``file``: reward 1 when a file matches (``equals``, ``contains`` or ``regex``), 0 when it does not or is missing.
- ``script``: a check script prints its reward (a number in [0, 1]) on its last line; it must exit 0, because a
  crashed check may have printed anything (the anchor's Harbor rule).
"""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from polar.errors import EvaluationError
from polar.evaluators.base import EvalContext, EvalResult, clamp_reward
from polar.runtime.base import ExecResult


def _excerpt(result: ExecResult, limit: int = 2000) -> dict[str, object]:
    return {**result.summary(), "stdout": result.stdout[-limit:], "stderr": result.stderr[-limit:]}


class CommandConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: str = Field(min_length=1, description="bash command line; {python} and {workdir} are replaced")
    env: dict[str, str] = Field(default_factory=dict)


class CommandEvaluator:
    name: ClassVar[str] = "command"
    Config: ClassVar[type[BaseModel]] = CommandConfig

    async def evaluate(self, config: CommandConfig, ctx: EvalContext) -> EvalResult:
        result = await ctx.runtime.exec(ctx.fill(config.command), env=config.env, timeout_s=ctx.timeout_s)
        if result.timed_out:
            raise EvaluationError(f"the check command timed out after {ctx.timeout_s:g} s")
        return EvalResult(1.0 if result.ok else 0.0, _excerpt(result))


class FileConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(min_length=1, description="relative to the working folder")
    equals: str | None = None
    contains: str | None = None
    regex: str | None = None
    strip: bool = Field(default=True, description="compare without surrounding whitespace")

    @model_validator(mode="after")
    def _one_test(self) -> FileConfig:
        given = [name for name in ("equals", "contains", "regex") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of equals, contains or regex")
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise ValueError(f"regex does not compile: {exc}") from None
        return self


class FileEvaluator:
    name: ClassVar[str] = "file"
    Config: ClassVar[type[BaseModel]] = FileConfig

    async def evaluate(self, config: FileConfig, ctx: EvalContext) -> EvalResult:
        path = ctx.runtime.layout.work / config.path
        if not path.is_file():
            return EvalResult(0.0, {"path": config.path, "found": False})
        text = path.read_text(errors="replace")
        text = text.strip() if config.strip else text
        if config.equals is not None:
            passed = text == (config.equals.strip() if config.strip else config.equals)
        elif config.contains is not None:
            passed = config.contains in text
        else:
            passed = re.search(config.regex or "", text) is not None
        return EvalResult(1.0 if passed else 0.0, {"path": config.path, "found": True, "excerpt": text[:500]})


class ScriptConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    script: str = Field(min_length=1, description="bash script; its last output line is the reward")
    env: dict[str, str] = Field(default_factory=dict)


class ScriptEvaluator:
    name: ClassVar[str] = "script"
    Config: ClassVar[type[BaseModel]] = ScriptConfig

    async def evaluate(self, config: ScriptConfig, ctx: EvalContext) -> EvalResult:
        script = await ctx.runtime.write_file(str(ctx.runtime.layout.private / "check.sh"), ctx.fill(config.script))
        result = await ctx.runtime.exec(["bash", str(script)], env=config.env, timeout_s=ctx.timeout_s)
        if result.timed_out:
            raise EvaluationError(f"the check script timed out after {ctx.timeout_s:g} s")
        if not result.ok:
            raise EvaluationError(
                f"the check script failed with exit code {result.returncode}: {result.stderr[-300:].strip()}"
            )
        lines = result.stdout.strip().splitlines()
        try:
            value = float(lines[-1])
        except (IndexError, ValueError):
            raise EvaluationError("the check script did not print a reward on its last line") from None
        return EvalResult(clamp_reward(value), _excerpt(result))
