"""Codex CLI (``@openai/codex`` 0.171.0): a custom model provider on the Responses API, no login.

``wire_api = "responses"`` is the only accepted value; the key comes from ``env_key``. Update checks,
analytics, feedback and history are off in ``config.toml``; the plugin, remote-plugin and app syncs (GitHub,
chatgpt.com) are disabled on the command line. ``danger-full-access``: the runtime is the sandbox, Codex's own
(bundled bubblewrap) is not used.
"""

from __future__ import annotations

from harness_adapters.base import RoleHints
from harness_adapters.npm_cli import CliSpec, NpmCliHarness

SPEC = CliSpec(
    tool="codex",
    files={
        ".codex/config.toml": (
            "toml",
            {
                "model": "{model}",
                "model_provider": "polar",
                "check_for_update_on_startup": False,
                "model_providers": {
                    "polar": {
                        "name": "Polar gateway",
                        "base_url": "{openai_url}",
                        "env_key": "POLAR_SESSION_KEY",
                        "wire_api": "responses",
                        "request_max_retries": 0,
                        "stream_max_retries": 0,
                    }
                },
                "analytics": {"enabled": False},
                "feedback": {"enabled": False},
                "history": {"persistence": "none"},
            },
        )
    },
    env={"CODEX_HOME": "{home}/.codex", "POLAR_SESSION_KEY": "{key}"},
    argv=[
        "exec",
        "--skip-git-repo-check",
        "--ephemeral",
        "-s",
        "danger-full-access",
        "--disable",
        "plugins",
        "--disable",
        "remote_plugin",
        "--disable",
        "apps",
        "-C",
        "{workdir}",
        "-m",
        "{model}",
        "{prompt}",
    ],
    # Its compaction request ends with this prompt (and offers no tools); the summary comes back in a user
    # message of the next request.
    role_hints=RoleHints(compaction_markers=("CONTEXT CHECKPOINT COMPACTION",)),
)

ADAPTER = NpmCliHarness("codex", SPEC)
