"""Claude Code (``@anthropic-ai/claude-code`` 2.1.332): Anthropic Messages at ``ANTHROPIC_BASE_URL``.

``-p`` needs no login when ``ANTHROPIC_API_KEY`` is set. Non-essential traffic (metrics, feature flags),
telemetry, the auto-updater and error reporting are off. ``acceptEdits`` lets ``Write``/``Edit`` run and
``--allowedTools Bash`` the shell (``--dangerously-skip-permissions`` is refused as root).

A model name it does not know makes 2.1.332 assume a 1,000,000-token context window (its auto-compaction point
and the ``contextWindow`` it reports); ``CLAUDE_CODE_MAX_CONTEXT_TOKENS`` gets the served model's real window
from the gateway session (``CliSpec.context_env``). A name it knows (``claude-sonnet-4-5``) keeps that model's
own window: 2.1.332 reads the variable only for names it does not know. Sub-agents (the ``Agent`` tool) run in
the background by default in 2.1.332: the main agent's calls go on while the sub-agent's chain runs.
"""

from __future__ import annotations

from harness_adapters.base import RoleHints
from harness_adapters.npm_cli import CliSpec, NpmCliHarness

SPEC = CliSpec(
    tool="claude",
    env={
        "ANTHROPIC_BASE_URL": "{anthropic_url}",
        "ANTHROPIC_API_KEY": "{key}",
        "CLAUDE_CONFIG_DIR": "{home}/.claude",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_BUG_COMMAND": "1",
        "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
    },
    argv=[
        "-p",
        "--model",
        "{model}",
        "--permission-mode",
        "acceptEdits",
        "--allowedTools",
        "Bash",
        "--output-format",
        "json",
        "{prompt}",
    ],
    # The Agent tool (Task in older releases) starts a sub-agent whose first user message is its prompt. Its
    # compaction call forks from the main conversation (same system prompt, every tool) and ends with a user
    # message that opens "CRITICAL: Respond with TEXT ONLY" (every variant: full, partial, reactive) and asks for
    # an <analysis> and a <summary> block; the next root opens with the rewritten summary after its own preamble.
    role_hints=RoleHints(
        sub_agent_tools={"Agent": "prompt", "Task": "prompt"},
        compaction_markers=("CRITICAL: Respond with TEXT ONLY", "detailed summary of the conversation so far"),
        continuation_markers=("This session is being continued from a previous conversation",),
    ),
    context_env="CLAUDE_CODE_MAX_CONTEXT_TOKENS",
)

ADAPTER = NpmCliHarness("claude_code", SPEC)
