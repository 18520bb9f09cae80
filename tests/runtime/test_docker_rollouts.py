"""A fix-the-bug task in docker runtimes through the pipeline: the harness edits a tiny repository in its
container, the ``tests`` evaluator runs pytest (the image's ``{python}``) in a fresh container prepared while the
harness ran, with the harness's diff applied. A fix earns 1, no fix 0, and no container is left."""

from __future__ import annotations

from db.enums import RolloutStatus
from tests.rollout.helpers import GIT_INIT
from tests.runtime.test_docker_faults import drive, stage_error

CALC = "def add(a, b):\n    return a - b\n"
TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


def fix_task(command: str) -> dict:
    return {
        "name": "fix-bug",
        "instruction": "add() in calc.py is wrong. Fix it.",
        "harness": {"name": "command", "config": {"command": command}},
        "runtime": {
            "type": "docker",
            "prepare": [{"type": "write_file", "path": "calc.py", "content": CALC}, {"command": GIT_INIT}],
        },
        "evaluator": {"type": "tests", "fresh_runtime": True, "config": {"files": {"test_calc.py": TEST}}},
        "num_samples": 1,
    }


async def test_a_fix_is_rewarded_by_tests_in_a_fresh_container(docker_context, no_leaks):
    fixed, _ = await drive(docker_context, fix_task("sed -i 's/a - b/a + b/' calc.py"), no_leaks)
    assert fixed.status is RolloutStatus.COMPLETED and fixed.reward == 1.0, stage_error(fixed)
    evaluation = fixed.stage_results["evaluate"]
    assert evaluation["fresh_runtime"]["applied_diff"] and evaluation["details"]["counts"] == {"passed": 1}
    assert fixed.stage_results["run"]["eval_runtime"]["runtime"]["type"] == "docker"  # prepared while it ran
    unfixed, _ = await drive(docker_context, fix_task("true"), no_leaks)
    assert unfixed.status is RolloutStatus.COMPLETED and unfixed.reward == 0.0, stage_error(unfixed)
