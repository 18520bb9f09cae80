"""Pi (``@mariozechner/pi-coding-agent`` 0.73.1): a ``polar`` provider in ``models.json`` (Chat Completions).

Pi has no base-URL variable, so the provider's ``baseUrl`` is written to its agent folder; ``apiKey`` names
the variable holding the key. Offline mode, no version check, no telemetry.
"""

from __future__ import annotations

from harness_adapters.npm_cli import CliSpec, NpmCliHarness

SPEC = CliSpec(
    tool="pi",
    files={
        ".pi/agent/models.json": (
            "json",
            {
                "providers": {
                    "polar": {
                        "baseUrl": "{openai_url}",
                        "api": "openai-completions",
                        "apiKey": "POLAR_SESSION_KEY",
                        "models": [{"id": "{model}", "name": "{model}"}],
                    }
                }
            },
        ),
        ".pi/agent/settings.json": ("json", {"enableInstallTelemetry": False}),
    },
    env={
        "PI_CODING_AGENT_DIR": "{home}/.pi/agent",
        "POLAR_SESSION_KEY": "{key}",
        "PI_OFFLINE": "1",
        "PI_SKIP_VERSION_CHECK": "1",
        "PI_TELEMETRY": "0",
    },
    argv=["-p", "--provider", "polar", "--model", "{model}", "{prompt}"],
)

ADAPTER = NpmCliHarness("pi", SPEC)
