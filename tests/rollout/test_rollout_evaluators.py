"""Evaluators: exit codes, file checks, check scripts, pytest-style tests and the LLM judge. A check that cannot
be trusted (crashed, timed out, no verdict) raises EvaluationError; it never becomes a silent 0."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from polar.errors import EvaluationError
from polar.evaluators import EVALUATORS, get_evaluator
from polar.evaluators.base import EvalContext, EvalResult
from polar.evaluators.chat import BackendChat
from polar.evaluators.judge import parse_score
from polar.evaluators.tests import parse_summary
from polar.runtime import LocalRuntime
from tests.rollout.helpers import test_settings


@pytest.fixture
async def runtime(tmp_path):
    rt = LocalRuntime("eval", tmp_path)
    await rt.start(fresh=True)
    return rt


def context(runtime, *, chat=None, artifacts=None, timeout_s=20.0) -> EvalContext:
    import sys

    return EvalContext("r", "Write polar into answer.txt.", runtime, timeout_s, sys.executable, artifacts or {}, chat)


async def evaluate(name: str, config: dict, ctx: EvalContext) -> EvalResult:
    evaluator = get_evaluator(name)
    return await evaluator.evaluate(evaluator.Config.model_validate(config), ctx)


def test_registry_lists_the_built_in_evaluators():
    assert set(EVALUATORS) == {"command", "file", "script", "tests", "llm_judge", "harbor", "swebench"}


async def test_command_rewards_exit_code_zero_and_refuses_a_timeout(runtime):
    await runtime.write_file("answer.txt", "polar\n")
    assert (await evaluate("command", {"command": "grep -q polar answer.txt"}, context(runtime))).reward == 1.0
    assert (await evaluate("command", {"command": "grep -q nope answer.txt"}, context(runtime))).reward == 0.0
    with pytest.raises(EvaluationError, match="timed out"):
        await evaluate("command", {"command": "sleep 5"}, context(runtime, timeout_s=0.3))


async def test_file_checks(runtime):
    await runtime.write_file("answer.txt", " polar \n")
    assert (await evaluate("file", {"path": "answer.txt", "equals": "polar"}, context(runtime))).reward == 1.0
    assert (await evaluate("file", {"path": "answer.txt", "regex": "^po.ar$"}, context(runtime))).reward == 1.0
    assert (await evaluate("file", {"path": "answer.txt", "contains": "arctic"}, context(runtime))).reward == 0.0
    missing = await evaluate("file", {"path": "nope.txt", "contains": "x"}, context(runtime))
    assert missing.reward == 0.0 and missing.details["found"] is False


async def test_a_check_script_prints_its_reward_and_must_exit_zero(runtime):
    assert (await evaluate("script", {"script": "echo checking; echo 0.75"}, context(runtime))).reward == 0.75
    assert (await evaluate("script", {"script": "echo 7"}, context(runtime))).reward == 1.0  # clamped
    with pytest.raises(EvaluationError, match="exit code 3"):
        await evaluate("script", {"script": "echo 1; exit 3"}, context(runtime))
    with pytest.raises(EvaluationError, match="did not print a reward"):
        await evaluate("script", {"script": "echo done"}, context(runtime))


TEST_FILE = (
    "from calc import add\n\n"
    "def test_add():\n    assert add(2, 3) == 5\n\n"
    "def test_zero():\n    assert add(0, 0) == 0\n"
)


async def test_pytest_style_tests_all_or_fraction(runtime):
    config = {"command": "{python} -m pytest -q -p no:cacheprovider", "files": {"test_calc.py": TEST_FILE}}
    await runtime.write_file("calc.py", "def add(a, b):\n    return a - b\n")
    failing = await evaluate("tests", config, context(runtime))
    assert failing.reward == 0.0 and failing.details["counts"] == {"passed": 1, "failed": 1}
    assert (await evaluate("tests", {**config, "mode": "fraction"}, context(runtime))).reward == 0.5
    await runtime.write_file("calc.py", "def add(a, b):\n    return a + b\n")
    assert (await evaluate("tests", config, context(runtime))).reward == 1.0
    with pytest.raises(EvaluationError, match="exit code 5"):  # no tests collected: the tests did not run
        await evaluate(
            "tests", {"command": "{python} -m pytest -q -p no:cacheprovider -k nothing_matches"}, context(runtime)
        )


def test_parse_pytest_summaries():
    assert parse_summary("..F\n=== 2 passed, 1 failed, 1 error in 0.12s ===") == {"passed": 2, "failed": 1, "errors": 1}
    assert parse_summary("3 passed in 0.01s") == {"passed": 3}
    assert parse_summary("no summary here") == {}


class VerdictChat:
    """A judge whose verdict is fixed: a model that grades sensibly cannot exist on this machine's tiny random
    model. The real-backend path is tested below with the local model."""

    def __init__(self, verdict: str):
        self.verdict = verdict
        self.seen: list[Sequence[tuple[str, str]]] = []

    async def complete(self, messages, *, max_tokens, temperature):
        self.seen.append(messages)
        return self.verdict


async def test_llm_judge_sees_task_rubric_and_diff_and_scales_the_score(runtime):
    chat = VerdictChat("The change is right.\nSCORE: 8")
    diff = "diff --git a/answer.txt b/answer.txt\n+polar\n"
    result = await evaluate(
        "llm_judge", {"rubric": "answer.txt must say polar"}, context(runtime, chat=chat, artifacts={"diff": diff})
    )
    assert result.reward == pytest.approx(0.8) and result.details["score"] == 8
    system, user = chat.seen[0]
    assert system[0] == "system" and "SCORE" in system[1]
    assert "Write polar into answer.txt." in user[1] and "answer.txt must say polar" in user[1] and "+polar" in user[1]
    with pytest.raises(EvaluationError, match="no 'SCORE"):
        await evaluate("llm_judge", {"rubric": "r"}, context(runtime, chat=VerdictChat("looks fine")))
    assert parse_score("score = 3.5 ... SCORE: 9") == 9.0


async def test_llm_judge_asks_the_configured_backend(runtime, tmp_path, cache_dir, tiny_model_dir):
    chat = BackendChat(test_settings(tmp_path, cache_dir, f"sqlite:///{tmp_path / 'x.db'}"))
    try:
        reply = await chat.complete([("system", "Grade."), ("user", "Say SCORE: 5")], max_tokens=12, temperature=0.0)
        assert isinstance(reply, str)
        # The tiny random model answers noise: the judge refuses to invent a reward from it.
        if parse_score(reply) is None:
            with pytest.raises(EvaluationError):
                await evaluate("llm_judge", {"rubric": "r", "max_tokens": 12}, context(runtime, chat=chat))
    finally:
        await chat.aclose()
