"""The ``command`` harness: any program, given its gateway session in the environment.

The program gets the usual client variables (``OPENAI_BASE_URL``/``OPENAI_API_KEY``, ``ANTHROPIC_*``,
``GOOGLE_GEMINI_BASE_URL``/``GEMINI_API_KEY``), ``POLAR_SESSION_ID``, ``POLAR_INSTRUCTION_FILE``,
``POLAR_MODEL`` and ``POLAR_SAMPLE_INDEX`` (which of its task's samples it is, from 0: a program that wants
reproducible samples can derive a per-sample ``seed`` for its calls from it). A string command runs with
``bash -c``; a list is an argv. Both may use the placeholders ``{instruction_file}``, ``{workdir}``, ``{model}``
and ``{python}`` (only these: other braces are left as they are).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from harness_adapters.base import (
    HarnessContext,
    LaunchSpec,
    ModelCalls,
    RoleHints,
    SessionAccess,
    fill_placeholders,
)


class CommandConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: str | list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    files: dict[str, str] = Field(default_factory=dict, description="written into the workdir at init")
    model_calls: ModelCalls = Field(
        default=ModelCalls.OPTIONAL,
        description="'none': the program never calls the model (an oracle, a no-op), so no gateway relay is started",
    )


class CommandHarness:
    name: ClassVar[str] = "command"
    Config: ClassVar[type[BaseModel]] = CommandConfig
    role_hints = RoleHints()  # structure alone labels its chains

    def model_calls(self, config: CommandConfig) -> ModelCalls:
        return config.model_calls

    def setup_files(self, config: CommandConfig, ctx: HarnessContext) -> Mapping[str, str]:
        return dict(config.files)

    def launch(self, config: CommandConfig, ctx: HarnessContext, session: SessionAccess) -> LaunchSpec:
        values = {
            "instruction_file": ctx.instruction_file,
            "workdir": ctx.workdir,
            "model": ctx.model,
            "python": ctx.python,
        }
        if isinstance(config.command, str):
            argv: tuple[str, ...] = ("bash", "-c", fill_placeholders(config.command, values))
        else:
            argv = tuple(fill_placeholders(part, values) for part in config.command)
        env = {
            **session.provider_env(),
            "POLAR_INSTRUCTION_FILE": ctx.instruction_file,
            "POLAR_MODEL": ctx.model,
            "POLAR_SAMPLE_INDEX": str(ctx.sample_index),
            **config.env,
        }
        return LaunchSpec(argv=argv, env=env)
