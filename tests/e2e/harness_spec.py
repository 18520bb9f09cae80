"""How an e2e harness is declared, and what every harness shares: ``Harness`` (one CLI run: its install pin,
config files, environment, headless argv, protocol, model name, scripted replies and the calls it makes
outside the main loop), ``reply`` (one scripted reply), the task every script performs, ``COMMON_ENV`` (the
switches every CLI gets) and ``placeholders`` (the values the runner fills in). The harnesses themselves are
tests/e2e/harnesses.py.

Strings in a Harness may hold placeholders that the runner fills in (the adapters' ``fill``):

    {home}     the per-run HOME           {workdir}  the directory the CLI runs in (absolute)
    {gateway}  http://127.0.0.1:PORT      {key}      the session's API key
    {model}    the model name the CLI asks for        {prompt}   the task
    {openai_url} {anthropic_url} {gemini_url}         the session's base URLs, as in the adapters' specs

Every script is: turn 1 writes {workdir}/hello.txt (with reasoning, ``THINK``), turn 2 runs a shell command
whose output proves it ran (``SHELL_CHECK``, printing ``MARKER``), turn 3 is the final text (``FINAL``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness_adapters.install import TOOLS, ToolPin

REPO = Path(__file__).resolve().parents[2]

PROMPT = "Create the file hello.txt containing exactly `hi` in the current directory, then show it with cat."
FINAL = "All done: hello.txt holds hi."
# The second tool turn runs this; its output holds "marker-42", which only the shell can produce (the
# arguments hold "marker-%d" and "42"), so finding it in the next prompt proves the tool ran and its output
# came back. (No $(...) or $((...)): Gemini CLI blocks command substitution.) The short sleep keeps the process
# alive until its output is read: Qwen Code 0.24.4's child-process shell takes the output on the process's "exit"
# event, which can come before its stdout's last "data" (seen: "Output: (empty)" for a command that printed).
SHELL_CHECK = "cat {workdir}/hello.txt && printf ' marker-%d\\n' 42 && sleep 0.3"
MARKER = "marker-42"
# The first reply carries reasoning too: each CLI gets it as its protocol's thinking/reasoning block and
# echoes it back (or drops it); either way the next call must still extend the chain in append mode.
THINK = "The user wants hello.txt with hi in it; I will write it, then check it."


def tools_dir() -> Path:
    """Where scripts/install_harnesses.sh put the CLIs (POLAR_TOOLS overrides)."""
    return Path(os.environ.get("POLAR_TOOLS") or REPO / ".polar-tools")


@dataclass(frozen=True)
class Harness:
    name: str  # the test id; variants of one CLI share ``tool``
    protocol: str  # captures.protocol the CLI's calls arrive as
    model: str  # the name the CLI asks for (the session accepts any)
    files: Mapping[str, tuple[str, Any]]  # path under HOME -> ("json" | "toml", data)
    env: Mapping[str, str]
    argv: Sequence[str]  # after the binary
    replies: list[dict[str, Any]]  # the scripted policy's replies to calls that offer tools
    tool_free_reply: str = "Polar session"
    # Calls outside the main loop that this CLI makes, each a separate root of the capture tree: the kinds
    # named in test_harnesses.AUX_CALLS (for example "title": OpenCode's title generation, no tools).
    aux_calls: tuple[str, ...] = ()
    expected_content: str = "hi"  # of {workdir}/hello.txt after the run
    dns_allowed: tuple[str, ...] = ()  # names the CLI may try to resolve with every switch off (see notes)
    websocket_first: bool = False  # tries a WebSocket upgrade before POSTing (Codex's built-in provider)
    tool: str = ""  # its pin in harness_adapters.install.TOOLS (the install folder); default: name
    # Deferred tools its script loads with a tool search (Claude Code's ToolSearch: tool_reference results).
    loads_tools: tuple[str, ...] = ()
    # The variable that tells the CLI the model's context window (the adapter's CliSpec.context_env).
    context_env: str = ""
    notes: str = ""

    @property
    def pin(self) -> ToolPin:
        return TOOLS[self.tool or self.name]

    @property
    def package(self) -> str:
        return self.pin.package

    @property
    def version(self) -> str:
        return self.pin.version

    @property
    def executable(self) -> Path:
        return self.pin.executable(tools_dir())

    @property
    def installed(self) -> bool:
        return self.pin.installed(tools_dir())

    def policy(self) -> dict[str, Any]:
        return {"type": "scripted", "replies": self.replies, "tool_free_reply": self.tool_free_reply, "then": FINAL}


def reply(
    text: str, name: str | None = None, arguments: dict[str, Any] | None = None, reasoning: str | None = None
) -> dict[str, Any]:
    calls = [{"name": name, "arguments": arguments or {}}] if name else []
    return {"content": text, "reasoning": reasoning, "tool_calls": calls}


# Switches every CLI gets (harmless where unused).
COMMON_ENV = {
    "DO_NOT_TRACK": "1",
    "NO_UPDATE_NOTIFIER": "1",
    "NPM_CONFIG_UPDATE_NOTIFIER": "false",
    "NO_COLOR": "1",
    "TERM": "dumb",
}


def placeholders(*, home: Path, workdir: Path, gateway: str, key: str, model: str) -> dict[str, str]:
    """The values ``fill`` puts in; the base URLs are the session's as ``SessionAccess.base_urls`` has them."""
    return {
        "prompt": PROMPT,
        "home": str(home),
        "workdir": str(workdir),
        "gateway": gateway,
        "openai_url": f"{gateway}/v1",
        "anthropic_url": gateway,
        "gemini_url": gateway,
        "key": key,
        "model": model,
    }
