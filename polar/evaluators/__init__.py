"""Evaluators in a registry (``EVALUATORS``, ``get_evaluator``): a rollout's reward from its outcome.

Built in: ``command`` (exit code), ``file`` (a file's content), ``script`` (a check script prints the reward),
``tests`` (a pytest-style test command), ``llm_judge`` (a model grades against a rubric), ``harbor`` (a Harbor
task's ``tests/test.sh`` and its reward files), ``swebench`` (a SWE-bench instance by the official grading).
The contract is in ``base``; ``chat.BackendChat`` is how a judge reaches the configured backend.
"""

from __future__ import annotations

from polar.errors import InvalidRequest
from polar.evaluators.base import ChatModel, EvalContext, EvalResult, Evaluator
from polar.evaluators.checks import CommandEvaluator, FileEvaluator, ScriptEvaluator
from polar.evaluators.harbor import HarborEvaluator
from polar.evaluators.judge import LLMJudge
from polar.evaluators.swebench import SWEbenchEvaluator
from polar.evaluators.tests import TestsEvaluator

EVALUATORS: dict[str, Evaluator] = {
    evaluator.name: evaluator
    for evaluator in (
        CommandEvaluator(),
        FileEvaluator(),
        ScriptEvaluator(),
        TestsEvaluator(),
        LLMJudge(),
        HarborEvaluator(),
        SWEbenchEvaluator(),
    )
}


def get_evaluator(name: str) -> Evaluator:
    try:
        return EVALUATORS[name]
    except KeyError:
        raise InvalidRequest(
            f"unknown evaluator {name!r}; known: {sorted(EVALUATORS)}", field="evaluator.type"
        ) from None


__all__ = ["EVALUATORS", "ChatModel", "EvalContext", "EvalResult", "Evaluator", "get_evaluator"]
