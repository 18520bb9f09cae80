"""OpenCode (``opencode-ai`` 1.18.33): a ``polar`` provider on ``@ai-sdk/openai-compatible`` (Chat Completions).

Auto-update, sharing, the models.dev fetch, default plugins, LSP downloads and the Claude Code import are off;
edits and bash are allowed without prompts. Its first call of every run is a tool-free title generation.
A fresh config folder makes it try to install ``@opencode-ai/plugin`` in the background; no switch turns that
off in this version, and without a network it fails harmlessly.
"""

from __future__ import annotations

from harness_adapters.base import RoleHints
from harness_adapters.npm_cli import CliSpec, NpmCliHarness

SPEC = CliSpec(
    tool="opencode",
    files={
        ".config/opencode/opencode.json": (
            "json",
            {
                "$schema": "https://opencode.ai/config.json",
                "autoupdate": False,
                "share": "disabled",
                "model": "polar/{model}",
                "small_model": "polar/{model}",
                "provider": {
                    "polar": {
                        "npm": "@ai-sdk/openai-compatible",
                        "name": "Polar gateway",
                        "options": {"baseURL": "{openai_url}", "apiKey": "{env:POLAR_SESSION_KEY}"},
                        "models": {"{model}": {"name": "{model}", "tool_call": True}},
                    }
                },
                "permission": {"edit": "allow", "bash": "allow"},
            },
        )
    },
    env={
        "POLAR_SESSION_KEY": "{key}",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "OPENCODE_DISABLE_CLAUDE_CODE": "1",
    },
    argv=["run", "--print-logs", "--auto", "-m", "polar/{model}", "{prompt}"],
    # Title generation and the compaction agent are tool-free calls with their own system prompts.
    role_hints=RoleHints(
        compaction_markers=("You are a context summarization agent",), title_markers=("You are a title generator",)
    ),
)

ADAPTER = NpmCliHarness("opencode", SPEC)
