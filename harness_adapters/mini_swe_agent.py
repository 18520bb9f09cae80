"""mini-swe-agent (``mini-swe-agent`` 2.4.6 from PyPI, ``polar harness install mini_swe_agent``).

Run headless with its ``mini`` entry point (``python3 -m minisweagent.run.mini``): yolo mode, exit when the agent
submits, no cost limit (the gateway's model has no price), the trajectory written to the logs folder. Its model
calls go through litellm's OpenAI client to the session's OpenAI base URL (``openai/<model>``).

``mode``: ``text`` (the default, the paper's and most SWE RL work's: THOUGHT plus one bash block per reply,
``mini_textbased.yaml`` with the ``litellm_textbased`` model) or ``tools`` (its tool-calling mode, ``mini.yaml``).
The package lives in the tools folder (``<tools>/mini_swe_agent/2.4.6/site``), read-only in containers, and runs
on the Python installed beside it (``<tools>/python``, ``harness_adapters.python_bundle``), so the task's image
may have another Python or none (``python`` names another interpreter, the image's ``python3`` say). Its first-run
setup, startup banner, cost map download
and global config folder are all turned off or moved into the harness's ``HOME``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from harness_adapters.base import HarnessContext, LaunchSpec, ModelCalls, RoleHints, SessionAccess
from harness_adapters.install import TOOLS
from harness_adapters.python_bundle import python_path
from polar.errors import SandboxError

PIN = TOOLS["mini_swe_agent"]
CONFIGS = {"text": ("mini_textbased.yaml", "litellm_textbased"), "tools": ("mini.yaml", "litellm")}


class MiniConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: Literal["text", "tools"] = "text"
    step_limit: int = Field(default=50, ge=0, description="agent steps before it stops (0: no limit)")
    python: str | None = Field(default=None, description="the interpreter that runs it; default the tools' Python")
    config: list[str] = Field(default_factory=list, description="more -c specs (key=value) after the defaults")
    env: dict[str, str] = Field(default_factory=dict)


class MiniSweAgent:
    name: ClassVar[str] = "mini_swe_agent"
    Config: ClassVar[type[BaseModel]] = MiniConfig
    role_hints = RoleHints()

    def model_calls(self, config: MiniConfig) -> ModelCalls:
        return ModelCalls.REQUIRED

    def setup_files(self, config: MiniConfig, ctx: HarnessContext) -> Mapping[str, str]:
        return {}

    def launch(self, config: MiniConfig, ctx: HarnessContext, session: SessionAccess) -> LaunchSpec:
        site = PIN.site(ctx.tools_dir)
        if not PIN.installed(ctx.tools_dir) or not (config.python or TOOLS["python"].installed(ctx.tools_dir)):
            raise SandboxError(
                f"mini-swe-agent {PIN.version} is not installed in {ctx.tools_dir}: run `polar harness install "
                "mini_swe_agent`"
            )
        yaml, model_class = CONFIGS[config.mode]
        argv = [
            config.python or str(python_path(ctx.tools_dir)),
            "-m",
            "minisweagent.run.mini",
            "--yolo",
            "--exit-immediately",
            "--model",
            f"openai/{ctx.model}",
            "--model-class",
            model_class,
            "--output",
            str(Path(ctx.logs_dir) / "mini_swe_agent.traj.json"),
            "-c",
            yaml,
            "-c",
            f"model.model_kwargs.api_base={session.base_urls['openai']}",
            "-c",
            "agent.cost_limit=0",
            "-c",
            f"agent.step_limit={config.step_limit}",
            *(part for spec in config.config for part in ("-c", spec)),
            "--task",
            ctx.instruction,
        ]
        env = {
            "PYTHONPATH": str(site),
            "OPENAI_API_KEY": session.api_key,
            "OPENAI_BASE_URL": session.base_urls["openai"],
            "MSWEA_CONFIGURED": "1",
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "MSWEA_GLOBAL_CONFIG_DIR": str(Path(ctx.home) / ".config" / "mini-swe-agent"),
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_TELEMETRY": "False",
            "NO_COLOR": "1",
            "TERM": "dumb",
            **config.env,
        }
        return LaunchSpec(argv=tuple(argv), env=env)


ADAPTER = MiniSweAgent()
