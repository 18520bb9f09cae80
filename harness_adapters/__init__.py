"""One small declarative module per agent harness, behind a registry (``ADAPTERS``, ``get_adapter``).

Built in, needing no npm: ``agent`` (Polar's small Python agent: OpenAI SDK, a bash tool, a turn limit) and
``command`` (any program, pointed at its session through the environment). The six agent CLIs, each a small
data module over ``npm_cli`` (installed with ``polar harness install NAME``, see ``install``): ``codex``,
``claude_code``, ``gemini_cli``, ``qwen_code``, ``opencode``, ``pi``; and ``mini_swe_agent`` (a PyPI package,
installed the same way). The contract is in ``base``.
"""

from __future__ import annotations

from harness_adapters import claude_code, codex, gemini_cli, mini_swe_agent, opencode, pi, qwen_code
from harness_adapters.base import (
    HarnessAdapter,
    HarnessContext,
    LaunchSpec,
    SessionAccess,
)
from harness_adapters.builtin import BuiltinAgent
from harness_adapters.command import CommandHarness
from polar.errors import InvalidRequest

_CLIS = (codex, claude_code, gemini_cli, qwen_code, opencode, pi, mini_swe_agent)
ADAPTERS: dict[str, HarnessAdapter] = {
    adapter.name: adapter for adapter in (BuiltinAgent(), CommandHarness(), *(module.ADAPTER for module in _CLIS))
}


def get_adapter(name: str) -> HarnessAdapter:
    try:
        return ADAPTERS[name]
    except KeyError:
        raise InvalidRequest(f"unknown harness {name!r}; known: {sorted(ADAPTERS)}", field="harness.name") from None


__all__ = ["ADAPTERS", "HarnessAdapter", "HarnessContext", "LaunchSpec", "SessionAccess", "get_adapter"]
