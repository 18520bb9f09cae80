"""The ``harbor`` evaluator: a Harbor task's verifier, run in the agent's container after the agent finished.

The task's ``tests/`` folder travels in the config (``files``, ``binary_files`` base64, ``executables``), so the
agent never saw it: it is written to ``/tests`` only now. ``/logs/verifier`` is made empty and ``bash
/tests/test.sh`` runs in the work folder (the image's WORKDIR), as ``user`` when given, with ``env`` and the
verifier timeout (the evaluator spec's ``timeout_s``, from ``[verifier] timeout_sec``).

The reward, by this rule: ``/logs/verifier/reward.txt`` (one number) when it exists; otherwise
``/logs/verifier/reward.json`` (an object of named numeric components), whose ``reward_key`` component is the
scalar when present and the mean of all components otherwise. The components are stored as the evaluation's
``details.components``. A value outside [0, 1] is clamped (the raw value is kept in ``details.raw``).

Infrastructure, not policy: a verifier that times out, writes neither file, or writes one that does not parse
raises ``EvaluationError`` (the rollout ends ERROR with that cause after the stage's retries), never a 0.
"""

from __future__ import annotations

import base64
import json
import math
import shlex
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from polar.errors import EvaluationError
from polar.evaluators.base import EvalContext, EvalResult, clamp_reward

SETUP = (
    'set -e; t=$1 v=$2; rm -rf /tests; cp -a "$t" /tests; chmod -R a+rX /tests; mkdir -p /logs; '
    'rm -rf /logs/verifier; mkdir -p "$v"; chmod 777 "$v"; ln -s "$v" /logs/verifier'
)


class HarborConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    files: dict[str, str] = Field(description="tests/ as relative path -> text; test.sh among them")
    binary_files: dict[str, str] = Field(default_factory=dict, description="relative path -> base64 bytes")
    executables: list[str] = Field(default_factory=list, description="paths of files that are executable")
    user: str | None = Field(default=None, description="run test.sh as this user ([verifier] user)")
    env: dict[str, str] = Field(default_factory=dict, description="[verifier] env")
    reward_key: str = Field(default="reward", description="reward.json's component that is the scalar reward")


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise EvaluationError(f"the verifier's {where} is not a finite number: {value!r}")
    return float(value)


def reward_from(text_reward: str | None, json_reward: str | None, reward_key: str) -> tuple[float, dict[str, Any]]:
    """The scalar reward and the details, by the rule in the module's docstring."""
    if text_reward is not None:
        try:
            raw = float(text_reward.strip())
        except ValueError:
            raise EvaluationError(f"reward.txt does not hold a number: {text_reward.strip()[:100]!r}") from None
        raw = _number(raw, "reward.txt")
        return clamp_reward(raw), {"source": "reward.txt", "raw": raw}
    if json_reward is None:
        raise EvaluationError("the verifier wrote neither /logs/verifier/reward.txt nor reward.json")
    try:
        parsed = json.loads(json_reward)
    except ValueError as exc:
        raise EvaluationError(f"reward.json is not JSON: {exc}") from None
    if not isinstance(parsed, dict) or not parsed:
        raise EvaluationError("reward.json must be a non-empty object of named numbers")
    components = {str(name): _number(value, f"reward.json component {name!r}") for name, value in parsed.items()}
    raw = components[reward_key] if reward_key in components else sum(components.values()) / len(components)
    rule = reward_key if reward_key in components else "mean"
    return clamp_reward(raw), {"source": "reward.json", "raw": raw, "rule": rule, "components": components}


class HarborEvaluator:
    name: ClassVar[str] = "harbor"
    Config: ClassVar[type[BaseModel]] = HarborConfig

    async def evaluate(self, config: HarborConfig, ctx: EvalContext) -> EvalResult:
        runtime = ctx.runtime
        if runtime.kind != "docker":
            raise EvaluationError(f"the harbor verifier needs the docker runtime, not {runtime.kind!r}")
        base = runtime.layout.private / "harbor"
        tests, verifier = base / "tests", base / "verifier"
        for path, content in config.files.items():
            await runtime.write_file(str(tests / path), content, executable=path in config.executables)
        for path, encoded in config.binary_files.items():
            raw = base64.b64decode(encoded)
            await runtime.write_file(str(tests / path), raw, executable=path in config.executables)
        for stale in (verifier / "reward.txt", verifier / "reward.json"):
            stale.unlink(missing_ok=True)
        setup = await runtime.exec(["sh", "-c", SETUP, "setup", str(tests), str(verifier)], timeout_s=60)
        if not setup.ok:
            raise EvaluationError(f"cannot install /tests for the verifier: {(setup.stderr or setup.stdout)[-300:]}")
        command = "bash /tests/test.sh"
        if config.user:
            command = f"runuser -u {shlex.quote(config.user)} -- {command}"
        result = await runtime.exec(command, env=config.env, timeout_s=ctx.timeout_s)
        details: dict[str, Any] = {
            **result.summary(),
            "stdout": result.stdout[-2000:],
            "stderr": result.stderr[-2000:],
        }
        if result.timed_out:
            raise EvaluationError(f"the verifier (tests/test.sh) timed out after {ctx.timeout_s:g} s")
        text = _read(verifier / "reward.txt")
        data = _read(verifier / "reward.json")
        if text is None and data is None:
            raise EvaluationError(
                "the verifier wrote neither /logs/verifier/reward.txt nor reward.json (test.sh exit code "
                f"{result.returncode}: {(result.stderr or result.stdout)[-300:].strip()})"
            )
        reward, found = reward_from(text, data, config.reward_key)
        return EvalResult(reward, {**found, **details})


def _read(path: Any) -> str | None:
    try:
        return str(path.read_text(errors="replace"))
    except OSError:
        return None
