"""Gemini CLI (``@google/gemini-cli`` 0.61.0): generateContent at ``GOOGLE_GEMINI_BASE_URL`` with an API key.

``-m`` names the model, so no router call is made. Auto-update, usage statistics and telemetry are off in
``settings.json``; API-key auth is preselected and folder trust off, so no login or trust prompt appears.
"""

from __future__ import annotations

from harness_adapters.base import RoleHints
from harness_adapters.npm_cli import CliSpec, NpmCliHarness

SPEC = CliSpec(
    tool="gemini",
    files={
        ".gemini/settings.json": (
            "json",
            {
                "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
                "privacy": {"usageStatisticsEnabled": False},
                "telemetry": {"enabled": False},
                "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
            },
        )
    },
    env={
        "GEMINI_API_KEY": "{key}",
        "GOOGLE_GEMINI_BASE_URL": "{gemini_url}",
        "GEMINI_CLI_NO_RELAUNCH": "1",
        "GEMINI_TELEMETRY_ENABLED": "false",
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
    },
    argv=["-m", "{model}", "--approval-mode", "yolo", "-o", "json", "-p", "{prompt}"],
    # History compression: a summariser call and its verification call, both under this system prompt (the
    # snapshot itself later sits in a user message, so the marker is the system prompt's, not the snapshot's).
    role_hints=RoleHints(compaction_markers=("distilling chat history into a structured XML <state_snapshot>",)),
)

ADAPTER = NpmCliHarness("gemini_cli", SPEC)
