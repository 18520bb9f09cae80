"""The ``agent`` harness: Polar's small built-in Python agent (``harness_adapters.polar_agent``).

It needs no npm and no network beyond the gateway: the OpenAI SDK pointed at the session, one ``bash`` tool
run in the working folder, and a turn limit. It is the embedded default and the harness of the demo.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from harness_adapters.base import HarnessContext, LaunchSpec, ModelCalls, RoleHints, SessionAccess

DEFAULT_SYSTEM_PROMPT = (
    "You are a coding agent working in a shell. Use the bash tool to inspect and change files in the current "
    "folder. When the task is done, answer without calling a tool."
)


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_turns: int = Field(default=8, ge=1, le=500, description="model calls before the agent stops")
    max_tokens: int = Field(default=256, ge=1, description="reply budget of each model call")
    temperature: float = Field(default=1.0, ge=0)
    command_timeout_s: float = Field(default=60.0, gt=0, description="limit of one bash command")
    output_limit: int = Field(default=4000, ge=100, description="characters of command output shown to the model")
    system_prompt: str = DEFAULT_SYSTEM_PROMPT


class BuiltinAgent:
    name: ClassVar[str] = "agent"
    Config: ClassVar[type[BaseModel]] = AgentConfig
    role_hints = RoleHints()  # structure alone labels its chains

    def model_calls(self, config: AgentConfig) -> ModelCalls:
        return ModelCalls.REQUIRED

    def setup_files(self, config: AgentConfig, ctx: HarnessContext) -> Mapping[str, str]:
        return {}

    def launch(self, config: AgentConfig, ctx: HarnessContext, session: SessionAccess) -> LaunchSpec:
        argv = (
            ctx.python,
            "-m",
            "harness_adapters.polar_agent",
            "--instruction-file",
            ctx.instruction_file,
            "--model",
            ctx.model,
            "--max-turns",
            str(config.max_turns),
            "--max-tokens",
            str(config.max_tokens),
            "--temperature",
            str(config.temperature),
            "--command-timeout",
            str(config.command_timeout_s),
            "--output-limit",
            str(config.output_limit),
            "--transcript",
            f"{ctx.logs_dir}/agent.jsonl",
        )
        env = {
            "OPENAI_BASE_URL": session.base_urls["openai"],
            "OPENAI_API_KEY": session.api_key,
            "POLAR_AGENT_SYSTEM_PROMPT": config.system_prompt,
        }
        return LaunchSpec(argv=argv, env=env)
