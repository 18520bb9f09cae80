"""The ``swebench`` evaluator: a SWE-bench-style instance graded by the official ``swebench`` package's rules.

After the agent ran, in its own container (the repository is the work folder, the agent's changes in place):

1. the instance's ``eval_script`` runs (the SWE-bench 5 instance field: reset the test files to the base commit,
   apply the test patch, run the test command between the ``>>>>> Start/End Test Output`` markers), made into a
   ``TestSpec`` by ``swebench.harness.utils.make_test_spec`` (which also records the test command's exit code);
2. its log is parsed by the instance's ``log_parser`` (``swebench.harness.log_parsers``) through
   ``swebench.harness.grading.get_logs_eval``;
3. ``get_eval_tests_report`` and ``get_resolution_status`` decide: reward 1 only for ``RESOLVED_FULL`` (every
   FAIL_TO_PASS test passes, no PASS_TO_PASS test fails), else 0.

The per-test outcomes (the status map), the report (which FAIL_TO_PASS / PASS_TO_PASS tests failed) and the
resolution are stored as the evaluation's details. Before the script, the test patch is checked to apply on the
base commit's test files: one that does not is an ``EvaluationError`` (the instance is broken, not the agent),
as is a script that times out. A log the official rules call invalid (no test output: the agent broke the test
run) scores 0 with the reason. ``swebench`` is an optional extra (``pip install polar[swebench]``), pinned.
"""

from __future__ import annotations

import shlex
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from polar.errors import EvaluationError
from polar.evaluators.base import EvalContext, EvalResult

PATCH_CHECK = (
    'set -u; base=$1 patch=$2; shift 2; for f in "$@"; do git checkout -q "$base" -- "$f" 2>/dev/null || rm -f "$f"; '
    'done; git apply --check "$patch"'
)


class SWEbenchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    instance_id: str = Field(min_length=1)
    repo: str = Field(min_length=1)
    version: str = ""
    base_commit: str = Field(min_length=1)
    image: str = ""
    test_patch: str = Field(min_length=1)
    eval_script: str = Field(min_length=1, description="the instance's eval.sh (SWE-bench 5's eval_script field)")
    FAIL_TO_PASS: list[str] = Field(min_length=1)
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    log_parser: str = Field(default="parse_log_pytest", description="a parser of swebench's PARSER_REGISTRY")
    eval_type: str = "pass_and_fail"


def patched_files(patch: str) -> list[str]:
    """The files a unified diff changes (its ``+++ b/...`` and ``--- a/...`` paths)."""
    files: list[str] = []
    for line in patch.splitlines():
        if line.startswith(("+++ b/", "--- a/")):
            path = line[6:].split("\t")[0]
            if path not in files:
                files.append(path)
    return files


def _grading() -> Any:
    try:
        from swebench.harness import grading, utils
    except ImportError as exc:
        raise EvaluationError(
            f"the swebench evaluator needs the swebench package (pip install polar[swebench]): {exc}"
        ) from None
    return grading, utils


def grade(config: SWEbenchConfig, log_path: str) -> tuple[float, dict[str, Any]]:
    """The reward and details of an eval script's log, by the official rules."""
    grading, utils = _grading()
    from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS, EvalType, ResolvedStatus

    spec = utils.make_test_spec({**config.model_dump(), "image": config.image or "polar"})
    status_map, valid = grading.get_logs_eval(spec, log_path)
    details: dict[str, Any] = {"instance_id": config.instance_id, "tests_status": status_map}
    if not valid:
        return 0.0, {**details, "resolution": ResolvedStatus.NO.value, "invalid_log": True}
    report = grading.get_eval_tests_report(
        status_map,
        {FAIL_TO_PASS: config.FAIL_TO_PASS, PASS_TO_PASS: config.PASS_TO_PASS},
        eval_type=EvalType(config.eval_type),
    )
    resolution = grading.get_resolution_status(report)
    details.update(
        resolution=resolution,
        report=report,
        failed_fail_to_pass=report[FAIL_TO_PASS]["failure"],
        failed_pass_to_pass=report[PASS_TO_PASS]["failure"],
    )
    return (1.0 if resolution == ResolvedStatus.FULL.value else 0.0), details


class SWEbenchEvaluator:
    name: ClassVar[str] = "swebench"
    Config: ClassVar[type[BaseModel]] = SWEbenchConfig

    async def evaluate(self, config: SWEbenchConfig, ctx: EvalContext) -> EvalResult:
        _grading()  # the package is there, or the stage fails with how to install it
        runtime = ctx.runtime
        private = runtime.layout.private / "swebench"
        patch = await runtime.write_file(str(private / "test.patch"), config.test_patch)
        tests = patched_files(config.test_patch)
        check = await runtime.exec(
            ["sh", "-c", PATCH_CHECK, "check", config.base_commit, str(patch), *tests], timeout_s=120
        )
        if not check.ok:
            raise EvaluationError(
                f"instance {config.instance_id}: the test patch does not apply on {config.base_commit[:12]}: "
                f"{(check.stderr or check.stdout)[-300:].strip()}"
            )
        grading, utils = _grading()
        spec = utils.make_test_spec({**config.model_dump(), "image": config.image or "polar"})
        script = await runtime.write_file(str(private / "eval.sh"), spec.eval_script)
        log = private / "eval.log"
        result = await runtime.exec(
            f"bash {shlex.quote(str(script))} > {shlex.quote(str(log))} 2>&1", timeout_s=ctx.timeout_s
        )
        if result.timed_out:
            raise EvaluationError(f"instance {config.instance_id}: the eval script timed out after {ctx.timeout_s:g} s")
        reward, details = grade(config, str(log))
        text = log.read_text(errors="replace") if log.is_file() else ""
        return EvalResult(reward, {**details, "returncode": result.returncode, "log": text[-3000:]})
