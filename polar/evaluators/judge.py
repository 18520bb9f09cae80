"""The ``llm_judge`` evaluator: a model grades the rollout against a rubric.

The judge sees the instruction, the rubric, the agent's changes (postrun's diff) and any files named in
``include_files``, and must answer with a line ``SCORE: <number>`` on a 0..``scale`` scale; the reward is the
score divided by ``scale``. It asks through the pipeline's ``ChatModel``: the judge's own model (``POLAR_JUDGE_*``;
the policy's backend only for the embedded local model), called directly, so judge calls never become policy
captures. A reply
without a score is an evaluation error, retried like any other; the rollout never gets a guessed reward.
"""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from polar.errors import EvaluationError
from polar.evaluators.base import EvalContext, EvalResult, clamp_reward

_SCORE = re.compile(r"score\s*[:=]\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
SECTION_LIMIT = 20_000
"""Characters of each section (diff, file) the judge sees; longer ones are cut in the middle."""

SYSTEM_PROMPT = (
    "You are a strict grader of a coding agent's work. Read the task, the rubric and the agent's changes. "
    "Reply with one line 'SCORE: <number from 0 to {scale:g}>' and nothing else."
)


def parse_score(reply: str) -> float | None:
    """The number after the last ``SCORE:`` in ``reply``, if any."""
    found = _SCORE.findall(reply)
    return float(found[-1]) if found else None


def _middle_cut(text: str, limit: int = SECTION_LIMIT) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters cut ...]\n{text[-half:]}"


class JudgeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rubric: str = Field(min_length=1)
    scale: float = Field(default=10.0, gt=0)
    include_diff: bool = True
    include_files: list[str] = Field(default_factory=list, description="files of the working folder to show")
    max_tokens: int = Field(default=64, ge=1)
    temperature: float = Field(default=0.0, ge=0)


class LLMJudge:
    name: ClassVar[str] = "llm_judge"
    Config: ClassVar[type[BaseModel]] = JudgeConfig

    def prompt(self, config: JudgeConfig, ctx: EvalContext) -> list[tuple[str, str]]:
        sections = [f"# Task\n{ctx.instruction}", f"# Rubric\n{config.rubric}"]
        if config.include_diff:
            sections.append(f"# Changes (git diff)\n{_middle_cut(str(ctx.artifacts.get('diff') or '(no changes)'))}")
        for name in config.include_files:
            path = ctx.runtime.layout.work / name
            body = path.read_text(errors="replace") if path.is_file() else "(missing)"
            sections.append(f"# File {name}\n{_middle_cut(body)}")
        return [("system", SYSTEM_PROMPT.format(scale=config.scale)), ("user", "\n\n".join(sections))]

    async def evaluate(self, config: JudgeConfig, ctx: EvalContext) -> EvalResult:
        if ctx.chat is None:
            raise EvaluationError("no model is configured for the LLM judge")
        reply = await ctx.chat.complete(
            self.prompt(config, ctx), max_tokens=config.max_tokens, temperature=config.temperature
        )
        score = parse_score(reply)
        if score is None:
            raise EvaluationError(f"the judge's reply has no 'SCORE: <number>': {reply[:200]!r}")
        return EvalResult(
            clamp_reward(score / config.scale), {"score": score, "scale": config.scale, "reply": reply[:2000]}
        )
