"""Qwen Code (``@qwen-code/qwen-code`` 0.24.4): OpenAI Chat Completions through a ``modelProviders`` entry.

OpenAI auth is preselected in ``settings.json`` (no login), the key comes from ``envKey``; auto-update, usage
statistics, telemetry and folder trust are off. So are its background memory agents (``memory.*``): managed
auto-memory extraction and its "dream" consolidation (on by default: after a turn that ends without a tool call
they send their own calls, a separate root each, racing the CLI's shutdown), the auto-skill review of tool-heavy
sessions and the team memory (both off by default in 0.24.4, kept off here).
"""

from __future__ import annotations

from harness_adapters.npm_cli import CliSpec, NpmCliHarness

SPEC = CliSpec(
    tool="qwen",
    files={
        ".qwen/settings.json": (
            "json",
            {
                "modelProviders": {
                    "openai": [
                        {"id": "{model}", "name": "{model}", "baseUrl": "{openai_url}", "envKey": "POLAR_SESSION_KEY"}
                    ]
                },
                "security": {"auth": {"selectedType": "openai"}, "folderTrust": {"enabled": False}},
                "model": {"name": "{model}"},
                "general": {"enableAutoUpdate": False, "disableAutoUpdate": True},
                "privacy": {"usageStatisticsEnabled": False},
                "telemetry": {"enabled": False},
                "memory": {
                    "enableManagedAutoMemory": False,
                    "enableManagedAutoDream": False,
                    "enableAutoSkill": False,
                    "enableTeamMemory": False,
                },
            },
        )
    },
    env={"POLAR_SESSION_KEY": "{key}", "QWEN_CODE_NO_RELAUNCH": "1"},
    argv=["--approval-mode", "yolo", "-o", "json", "{prompt}"],
)

ADAPTER = NpmCliHarness("qwen_code", SPEC)
