"""What the six npm agent CLIs share: a declarative adapter filled in from data (``CliSpec``).

A CLI module declares its pinned tool (``install.TOOLS``), the config files it reads (a path under ``HOME`` →
``("json" | "toml", data)``), the environment and the headless argv. Strings may use these placeholders:

    {home} {workdir}        the harness's HOME and working folder       {model}   the model name it asks for
    {openai_url}            the session's OpenAI base URL (…/v1)         {prompt}  the instruction
    {anthropic_url}         the session's Anthropic base URL (root)      {key}     the session key
    {gemini_url}            the session's Gemini base URL (root)

Config files are rendered with real serialisers (``json``, ``tomli_w``) and, since they hold the session's
base URL, are written at launch. The key goes in the environment (``POLAR_SESSION_KEY`` or the CLI's own
variable), never in a file. ``context_env`` names the variable that gets the served model's context window
(``SessionAccess.context_length``, from the gateway) when the session knows it; a task's ``config.env`` may
still override it. Every CLI also gets ``COMMON_ENV`` and XDG folders inside its ``HOME``, so
telemetry, update checks and login flows stay off and nothing is read from the host user's config.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field

from harness_adapters.base import HarnessContext, LaunchSpec, ModelCalls, RoleHints, SessionAccess
from harness_adapters.install import TOOLS, ToolPin
from polar.errors import SandboxError

COMMON_ENV = {
    "DO_NOT_TRACK": "1",
    "NO_UPDATE_NOTIFIER": "1",
    "NPM_CONFIG_UPDATE_NOTIFIER": "false",
    "NO_COLOR": "1",
    "TERM": "dumb",
    "CI": "1",
}


class CliConfig(BaseModel):
    """A task's ``harness.config`` for an npm CLI."""

    model_config = ConfigDict(extra="forbid")
    extra_args: list[str] = Field(default_factory=list, description="appended to the headless argv, before the prompt")
    env: dict[str, str] = Field(default_factory=dict, description="more environment (after the adapter's own)")


_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def fill(value: Any, values: Mapping[str, str]) -> Any:
    """``value`` with every ``{name}`` of ``values`` replaced in each string of a nested structure (keys too)."""
    if isinstance(value, str):
        # One pass: a value's own text (an instruction that holds "{home}") is never filled in again.
        return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), value)
    if isinstance(value, Mapping):
        return {fill(k, values): fill(v, values) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [fill(v, values) for v in value]
    return value


def render(fmt: Literal["json", "toml"], data: Any) -> str:
    return json.dumps(data, indent=2) if fmt == "json" else tomli_w.dumps(data)


@dataclass(frozen=True)
class CliSpec:
    tool: str  # a key of install.TOOLS
    argv: Sequence[str]  # after the binary; "{prompt}" is the instruction
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, tuple[Literal["json", "toml"], Any]] = field(default_factory=dict)
    role_hints: RoleHints = field(default_factory=RoleHints)
    context_env: str = ""  # the variable that gets the model's context window in tokens (none: not told)


class NpmCliHarness:
    """An adapter built from a ``CliSpec``; ``name`` is the harness name of tasks."""

    Config: ClassVar[type[BaseModel]] = CliConfig

    def __init__(self, name: str, spec: CliSpec):
        self.name = name
        self.spec = spec

    @property
    def role_hints(self) -> RoleHints:
        return self.spec.role_hints

    @property
    def pin(self) -> ToolPin:
        return TOOLS[self.spec.tool]

    def model_calls(self, config: CliConfig) -> ModelCalls:
        return ModelCalls.REQUIRED

    def setup_files(self, config: CliConfig, ctx: HarnessContext) -> Mapping[str, str]:
        return {}

    def context_env(self, session: SessionAccess) -> dict[str, str]:
        """``{context_env: window}`` when the CLI takes the window from a variable and the session knows it."""
        if not self.spec.context_env or not session.context_length:
            return {}
        return {self.spec.context_env: str(session.context_length)}

    def launch(self, config: CliConfig, ctx: HarnessContext, session: SessionAccess) -> LaunchSpec:
        if not ctx.tools_dir:
            raise SandboxError(f"harness {self.name} needs the tools folder (POLAR_TOOLS)")
        values = {
            "prompt": ctx.instruction,
            "home": ctx.home,
            "workdir": ctx.workdir,
            "model": ctx.model,
            "key": session.api_key,
            "openai_url": session.base_urls["openai"],
            "anthropic_url": session.base_urls["anthropic"],
            "gemini_url": session.base_urls["gemini"],
        }
        files = {
            f"{ctx.home}/{fill(path, values)}": render(fmt, fill(data, values))
            for path, (fmt, data) in self.spec.files.items()
        }
        env = {
            **COMMON_ENV,
            "XDG_CONFIG_HOME": f"{ctx.home}/.config",
            "XDG_DATA_HOME": f"{ctx.home}/.local/share",
            "XDG_CACHE_HOME": f"{ctx.home}/.cache",
            "XDG_STATE_HOME": f"{ctx.home}/.local/state",
            **fill(dict(self.spec.env), values),
            **self.context_env(session),
            **config.env,
        }
        argv = [fill(part, values) for part in self.spec.argv]
        if config.extra_args:
            at = argv.index(ctx.instruction) if ctx.instruction in argv else len(argv)
            argv[at:at] = config.extra_args
        return LaunchSpec(argv=(str(self.pin.executable(ctx.tools_dir)), *argv), env=env, files=files)
