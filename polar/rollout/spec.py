"""The task model: ``TaskRequest`` and the specs it holds, validated before anything is stored.

A task asks for ``num_samples`` rollouts of one harness on one instruction, each in its own runtime and its own
gateway session, scored by one evaluator. ``parse_task_request`` turns any validation problem into an
``InvalidRequest`` that names the field (``harness.config.max_turns``, ``runtime.prepare.0.command``), including
the harness's and the evaluator's own config models and the registries (harness, evaluator, runtime, builder),
so a typo fails the submission instead of forty rollouts.

Timeouts: ``timeout_s`` is the shared deadline of init and run (default ``POLAR_ROLLOUT_TIMEOUT_S``), armed when
a flow claims the rollout; ``agent_timeout_s`` is the agent's own budget, counted from the moment the harness
launches, so time spent initialising or waiting for a run slot never eats into it. A harness stopped by its
agent budget is a clean, trainable negative; one stopped by the deadline is not.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from polar.capture_extras import CaptureOptions
from polar.errors import InvalidRequest, invalid_from
from polar.settings import Isolation
from polar.trajectory.choices import BuilderOptions


class PrepareAction(BaseModel):
    """One step that readies a runtime: run a command, write a file, or copy a host file/folder in.

    Each action retries on its own (``max_attempts``, waiting ``retry_backoff_s`` × attempt between tries),
    so a flaky download does not fail the rollout.
    """

    model_config = ConfigDict(extra="forbid")
    type: Literal["exec", "write_file", "copy"] = "exec"
    command: str | None = Field(default=None, description="exec: a bash command line, run in the working folder")
    path: str | None = Field(default=None, description="write_file/copy: the target, relative to the working folder")
    content: str | None = Field(default=None, description="write_file: the file's text")
    executable: bool = False
    source: str | None = Field(default=None, description="copy: a host file or folder")
    env: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = Field(default=300.0, gt=0)
    max_attempts: int = Field(default=1, ge=1, le=10)
    retry_backoff_s: float = Field(default=0.5, ge=0)

    @model_validator(mode="after")
    def _fields_of_type(self) -> PrepareAction:
        needed = {"exec": ("command",), "write_file": ("path", "content"), "copy": ("source", "path")}[self.type]
        missing = [name for name in needed if getattr(self, name) is None]
        if missing:
            raise ValueError(f"a {self.type} action needs {' and '.join(missing)}")
        return self

    def label(self) -> str:
        return self.command if self.type == "exec" else f"{self.type} {self.path}"  # type: ignore[return-value]


class RuntimeSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: str | None = Field(default=None, description="a runtime of polar.runtime.RUNTIMES; default POLAR_RUNTIME")
    prepare: list[PrepareAction] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict, description="environment of every command in the runtime")
    isolation: Isolation | None = Field(default=None, description="default POLAR_RUNTIME_ISOLATION")
    options: dict[str, Any] = Field(
        default_factory=dict, description="the runtime's own options (polar.runtime.OPTIONS)"
    )


class HarnessSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="a harness of harness_adapters.ADAPTERS")
    model: str = Field(default="polar", description="the model name the harness asks for (the gateway serves any)")
    config: dict[str, Any] = Field(default_factory=dict, description="the adapter's Config")


class EvaluatorSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: str = Field(description="an evaluator of polar.evaluators.EVALUATORS")
    config: dict[str, Any] = Field(default_factory=dict, description="the evaluator's Config")
    timeout_s: float = Field(default=300.0, gt=0)
    fresh_runtime: bool = Field(default=False, description="evaluate in a new runtime prepared while the agent runs")
    network: Literal["same", "none", "host"] | None = Field(
        default=None, description="the verifier's network (same: the agent's); default POLAR_VERIFY_NETWORK"
    )
    prepare: list[PrepareAction] | None = Field(
        default=None, description="fresh runtime recipe; default runtime.prepare"
    )
    copy_paths: list[str] = Field(
        default_factory=list, description="files copied from the agent's folder to the fresh one"
    )


class TaskRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(default=None, max_length=128)
    instruction: str = Field(min_length=1)
    harness: HarnessSpec
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    evaluator: EvaluatorSpec
    builder: str = "prefix_merge"
    builder_options: BuilderOptions = Field(
        default_factory=BuilderOptions,
        description="which chain roles train and how the reward reaches sub-agent and post-compaction chains",
    )
    num_samples: int = Field(default=1, ge=1, le=4096)
    timeout_s: float | None = Field(default=None, gt=0)
    agent_timeout_s: float | None = Field(default=None, gt=0)
    priority: int = Field(default=0, ge=0, le=100)
    policies: list[dict[str, Any]] | None = Field(
        default=None,
        description="gateway session policies (e.g. scripted replies for tests and demos), cycled over the samples",
    )
    metadata: dict[str, Any] = Field(default_factory=dict, description="free-form: group, policy version, step, ...")
    capture: CaptureOptions | None = Field(
        default=None, description="what every call captures beyond sampled ids: top_logprobs: k, routed_experts: true"
    )
    callback_url: str | None = Field(
        default=None, max_length=2048, description="POSTed the task's result when all its samples have finished"
    )

    @field_validator("callback_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("callback_url must be an http:// or https:// URL")
        return value

    @property
    def step(self) -> int | None:
        """The trainer step this task's samples are for (``metadata.step``), which admission control reads."""
        step = self.metadata.get("step")
        return step if isinstance(step, int) and not isinstance(step, bool) else None

    @field_validator("builder")
    @classmethod
    def _known_builder(cls, value: str) -> str:
        from polar.trajectory.registry import BUILDERS

        if value not in BUILDERS:
            raise ValueError(f"unknown builder {value!r}; known: {sorted(BUILDERS)}")
        return value

    @field_validator("policies")
    @classmethod
    def _policies(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        if value is not None and not value:
            raise ValueError("give at least one policy, or leave policies out")
        return value

    def policy_for(self, sample_index: int) -> dict[str, Any] | None:
        return self.policies[sample_index % len(self.policies)] if self.policies else None


def _check_registries(request: TaskRequest) -> None:
    from harness_adapters import get_adapter
    from polar.evaluators import get_evaluator
    from polar.runtime import check_runtime

    adapter = get_adapter(request.harness.name)
    try:
        adapter.Config.model_validate(request.harness.config)
    except ValidationError as exc:
        raise invalid_from(exc, "task", prefix="harness.config") from None
    evaluator = get_evaluator(request.evaluator.type)
    try:
        evaluator.Config.model_validate(request.evaluator.config)
    except ValidationError as exc:
        raise invalid_from(exc, "task", prefix="evaluator.config") from None
    if request.runtime.type is not None:
        check_runtime(request.runtime.type, request.runtime.options)
    elif request.runtime.options:
        raise InvalidRequest("runtime.options need runtime.type", field="runtime.options")
    if request.policies:
        from polar.wire.policy import ScriptedPolicySpec

        for index, policy in enumerate(request.policies):
            try:
                ScriptedPolicySpec.parse(policy)
            except InvalidRequest as exc:
                where = f"policies.{index}.{(exc.field or '').removeprefix('policy.')}".rstrip(".")
                raise InvalidRequest(f"invalid task at {where}: {exc.message}", field=where) from None


def parse_task_request(raw: Any) -> TaskRequest:
    """A validated ``TaskRequest`` from a dict (or one already built); ``InvalidRequest`` names the bad field."""
    if isinstance(raw, TaskRequest):
        request = raw
    else:
        try:
            request = TaskRequest.model_validate(raw)
        except ValidationError as exc:
            raise invalid_from(exc, "task") from None
    try:
        _check_registries(request)
    except InvalidRequest as exc:
        if exc.message.startswith("invalid task at"):
            raise
        raise InvalidRequest(f"invalid task at {exc.field}: {exc.message}", field=exc.field) from None
    return request
