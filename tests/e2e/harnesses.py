"""The six agent CLIs, declared: where they are installed, the config files they read, the environment that
points them at a gateway session with telemetry, update checks and login flows off, the headless command,
and the scripted replies that make each take specific actions with its own tool names and argument shapes.
After the six come variants: the same CLIs through their other providers, protocols and model names.

What the adapters in harness_adapters/ already declare comes from them, so the e2e runs exactly what a rollout
launches: the pin (package, version, binary: ``install.TOOLS``) and each CLI's config files, environment and
headless argv (its ``SPEC``), except where a harness here says otherwise and why. What only these tests need is
declared here: the protocol, the model name, the scripted replies, the calls outside the main loop.

Everything here is data, ``Harness`` records (tests/e2e/harness_spec.py: the record, the task every script
performs and the placeholders such as {workdir} and {gateway} that the runner fills in). Config files are
written with the adapters' serialisers (``npm_cli.render``: ``json``, ``tomli_w``). Every switch is explained
in docs/harnesses.md and the adapters in harness_adapters/. Versions are those scripts/install_harnesses.sh
pins (they run on the tools folder's Node 22: `polar harness install node`).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from harness_adapters import claude_code, codex, gemini_cli, opencode, pi, qwen_code
from tests.e2e.harness_spec import SHELL_CHECK, THINK, Harness, reply

CODEX = Harness(
    name="codex",
    protocol="openai_responses",
    # An uncatalogued name: Codex then declares plain function tools (exec_command, ...) at the top level.
    model="polar-tiny",
    files=codex.SPEC.files,
    env=codex.SPEC.env,
    # The adapter's argv but for the sandbox: in a rollout the runtime is Codex's sandbox (danger-full-access);
    # here it runs on the host and keeps its own.
    argv=["workspace-write" if part == "danger-full-access" else part for part in codex.SPEC.argv],
    replies=[
        reply(
            "I will create the file.",
            "exec_command",
            {"cmd": "printf hi > {workdir}/hello.txt", "workdir": "{workdir}"},
            reasoning=THINK,
        ),
        reply("Now I check it.", "exec_command", {"cmd": SHELL_CHECK, "workdir": "{workdir}"}),
    ],
)

CLAUDE = Harness(
    name="claude",
    protocol="anthropic_messages",
    model="polar-tiny",
    files=claude_code.SPEC.files,
    # The adapter's environment but for CLAUDE_CONFIG_DIR: here Claude Code keeps its default (~/.claude).
    env={name: value for name, value in claude_code.SPEC.env.items() if name != "CLAUDE_CONFIG_DIR"},
    argv=claude_code.SPEC.argv,
    replies=[
        reply(
            "I will create the file.", "Write", {"file_path": "{workdir}/hello.txt", "content": "hi"}, reasoning=THINK
        ),
        reply("Now I check it.", "Bash", {"command": SHELL_CHECK, "description": "Show hello.txt"}),
    ],
    context_env=claude_code.SPEC.context_env,
)

GEMINI = Harness(
    name="gemini",
    protocol="gemini",
    model="polar-tiny",  # -m: no router calls
    files=gemini_cli.SPEC.files,
    env=gemini_cli.SPEC.env,
    argv=gemini_cli.SPEC.argv,
    replies=[
        reply(
            "I will create the file.",
            "write_file",
            {"file_path": "{workdir}/hello.txt", "content": "hi"},
            reasoning=THINK,
        ),
        reply("Now I check it.", "run_shell_command", {"command": SHELL_CHECK, "description": "Show hello.txt"}),
    ],
)

QWEN = Harness(
    name="qwen",
    protocol="openai_chat",
    model="polar-tiny",
    files=qwen_code.SPEC.files,
    env=qwen_code.SPEC.env,
    argv=qwen_code.SPEC.argv,
    replies=[
        reply(
            "I will create the file.",
            "write_file",
            {"file_path": "{workdir}/hello.txt", "content": "hi"},
            reasoning=THINK,
        ),
        reply("Now I check it.", "run_shell_command", {"command": SHELL_CHECK, "description": "Show hello.txt"}),
    ],
)

OPENCODE = Harness(
    name="opencode",
    protocol="openai_chat",
    model="polar-tiny",
    files=opencode.SPEC.files,
    env=opencode.SPEC.env,
    argv=opencode.SPEC.argv,
    replies=[
        reply(
            "I will create the file.", "write", {"filePath": "{workdir}/hello.txt", "content": "hi"}, reasoning=THINK
        ),
        reply("Now I check it.", "bash", {"command": SHELL_CHECK, "description": "Show hello.txt"}),
    ],
    aux_calls=("title",),
    # A fresh config dir makes it install @opencode-ai/plugin in the background (bun, registry.npmjs.org);
    # no switch turns that off in 1.18.33 (not --pure either); it fails harmlessly without a network.
    dns_allowed=("registry.npmjs.org",),
    notes="The first call of every run is title generation (no tools): a separate root.",
)

PI = Harness(
    name="pi",
    protocol="openai_chat",
    model="polar-tiny",
    files=pi.SPEC.files,
    env=pi.SPEC.env,
    argv=pi.SPEC.argv,
    replies=[
        reply("I will create the file.", "write", {"path": "{workdir}/hello.txt", "content": "hi"}, reasoning=THINK),
        reply("Now I check it.", "bash", {"command": SHELL_CHECK}),
    ],
)


# ---- variants: other provider paths, protocols and model names of the same CLIs ---------------------------

CODEX_OPENAI = replace(
    CODEX,
    name="codex-openai",
    tool="codex",
    # The built-in openai provider, redirected with openai_base_url: it tries a WebSocket on /v1/responses
    # first; the gateway refuses the upgrade with 426 and Codex falls back to HTTP at once.
    files={
        ".codex/config.toml": (
            "toml",
            {
                "model": "{model}",
                "openai_base_url": "{gateway}/v1",
                "check_for_update_on_startup": False,
                "analytics": {"enabled": False},
                "feedback": {"enabled": False},
                "history": {"persistence": "none"},
            },
        )
    },
    env={"CODEX_HOME": "{home}/.codex", "CODEX_API_KEY": "{key}"},
    websocket_first=True,
)

# A catalogued model name: no top-level tools; an additional_tools input item holds namespaces, and the
# model answers with a custom_tool_call to the freeform "functions.exec" tool whose input is JavaScript
# that Codex runs in its code-mode V8 host.
CODEX_CODE_MODE = replace(
    CODEX,
    name="codex-code-mode",
    tool="codex",
    model="gpt-6.1-sol",
    replies=[
        reply(
            "I will create the file.",
            "functions.exec",
            {"input": "await tools.exec_command({cmd: 'printf hi > {workdir}/hello.txt'})"},
            reasoning=THINK,
        ),
        # text(...) hands the nested tool's result back to the model as the script's output.
        reply(
            "Now I check it.",
            "functions.exec",
            {"input": "text(await tools.exec_command({cmd: " + json.dumps(SHELL_CHECK) + "}))"},
        ),
    ],
)

# A catalogued model name: Claude Code then sends a 26k-char system prompt, 82k chars of tools and
# thinking {type: enabled, budget_tokens}, and folds the agent list into the user turn (41k tokens).
CLAUDE_SONNET = replace(CLAUDE, name="claude-sonnet", tool="claude", model="claude-sonnet-4-5")

# Claude Code 2.1.332 defers some tools: their names are listed in the system prompt, their schemas are not sent
# (a DeferredToolPlaceholder tool stands in). ToolSearch "select:CronList" loads one: its tool_result holds a
# tool_reference block, the calls after it declare CronList, and the model calls it (no arguments, no side effect).
CLAUDE_TOOL_SEARCH = replace(
    CLAUDE,
    name="claude-tool-search",
    tool="claude",
    replies=[
        CLAUDE.replies[0],
        reply("I will load the cron tool.", "ToolSearch", {"query": "select:CronList"}),
        reply("Listing the jobs.", "CronList", {}),
        CLAUDE.replies[1],
    ],
    loads_tools=("CronList",),
)

# No -m: "auto" routing. Before the first turn a tool-free, non-streaming, JSON-mode router call picks the
# model; the scripted tool-free reply is a schema-valid routing decision. The router call is its own root.
GEMINI_AUTO = replace(
    GEMINI,
    name="gemini-auto",
    tool="gemini",
    argv=["--approval-mode", "yolo", "-o", "json", "-p", "{prompt}"],
    tool_free_reply=json.dumps({"complexity_reasoning": "a simple file task", "complexity_score": 1}),
    aux_calls=("router",),
)


def _opencode(provider: str, model: str, protocol: str, replies: list[dict[str, Any]], **changes: Any) -> Harness:
    config = dict(OPENCODE.files[".config/opencode/opencode.json"][1])
    config.update(
        model=f"{provider}/{model}",
        small_model=f"{provider}/{model}",
        provider={provider: {"options": {"baseURL": "{gateway}/v1", "apiKey": "{env:POLAR_SESSION_KEY}"}}},
    )
    return replace(
        OPENCODE,
        name=f"opencode-{provider}",
        tool="opencode",
        protocol=protocol,
        model=model,
        files={".config/opencode/opencode.json": ("json", config)},
        argv=["run", "--print-logs", "--auto", "-m", f"{provider}/{model}", "{prompt}"],
        replies=replies,
        **changes,
    )


OPENCODE_ANTHROPIC = _opencode("anthropic", "claude-sonnet-4-5", "anthropic_messages", OPENCODE.replies)
# The built-in openai provider speaks Responses, and apply_patch replaces edit/write there.
OPENCODE_OPENAI = _opencode(
    "openai",
    "gpt-5.1",
    "openai_responses",
    [
        reply(
            "I will create the file.",
            "apply_patch",
            {"patchText": "*** Begin Patch\n*** Add File: {workdir}/hello.txt\n+hi\n*** End Patch"},
            reasoning=THINK,
        ),
        OPENCODE.replies[1],
    ],
    expected_content="hi\n",
)


def _pi(api: str, base: str, protocol: str) -> Harness:
    provider = {
        "baseUrl": base,
        "api": api,
        "apiKey": "POLAR_SESSION_KEY",
        "models": [{"id": "{model}", "name": "{model}"}],
    }
    files = {**PI.files, ".pi/agent/models.json": ("json", {"providers": {"polar": provider}})}
    return replace(PI, name=f"pi-{api}", tool="pi", protocol=protocol, files=files)


# A turn that ends at once (the first call gets the final text): Qwen Code 0.24.4 runs its background memory
# extraction and dream after such a turn unless the adapter's settings turn them off; none may reach the gateway.
QWEN_ANSWER = replace(QWEN, name="qwen-answer", tool="qwen", replies=[])

PI_ANTHROPIC = _pi("anthropic-messages", "{gateway}", "anthropic_messages")  # Pi appends /v1/messages
PI_RESPONSES = _pi("openai-responses", "{gateway}/v1", "openai_responses")
PI_GEMINI = _pi("google-generative-ai", "{gateway}/v1beta", "gemini")

# The six CLIs of the issue, then the variants.
HARNESSES: dict[str, Harness] = {
    h.name: h
    for h in (
        CODEX,
        CLAUDE,
        GEMINI,
        QWEN,
        OPENCODE,
        PI,
        CODEX_OPENAI,
        CODEX_CODE_MODE,
        CLAUDE_SONNET,
        CLAUDE_TOOL_SEARCH,
        GEMINI_AUTO,
        OPENCODE_ANTHROPIC,
        OPENCODE_OPENAI,
        PI_ANTHROPIC,
        PI_RESPONSES,
        PI_GEMINI,
    )
}

# Runs with checks of their own (not the tool loop's): the runner accepts their names too.
OTHER_RUNS: dict[str, Harness] = {h.name: h for h in (QWEN_ANSWER,)}
