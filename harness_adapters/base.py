"""The harness adapter contract: what a harness needs written and how it is launched, declared as data.

An adapter never runs anything itself. At init it may return static files (configuration without secrets);
at run it returns a ``LaunchSpec``: the argv, the environment (base URLs and the session key that point the
harness at its gateway session) and files to write just before launch (which may hold the key). The run stage
writes the files, launches the argv in the rollout's runtime and treats the exit code as the outcome.

Each adapter has a pydantic ``Config`` (the ``config`` of a task's harness spec), validated when the task is
submitted, so a typo fails the submission and not the fortieth rollout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel


class ModelCalls(StrEnum):
    """What a harness, so configured, does with the model; the run stage acts on it.

    ``required``: an agent. A run that exits 0 without one model call reaching its session did not run the
    policy (it could not start its client, or crashed and exited 0): an infrastructure error, never a sample.
    ``optional``: a program that may call the model or not (``command``). ``none``: it never does (a task's
    oracle, a no-op): no gateway relay is started for it, so it needs nothing the relay needs (Node)."""

    REQUIRED = "required"
    OPTIONAL = "optional"
    NONE = "none"


@dataclass(frozen=True)
class RoleHints:
    """What a harness adapter declares about its side calls (data, never code).

    ``sub_agent_tools``: tool name -> the argument holding the sub-agent's prompt (Claude Code: ``Agent.prompt``).
    ``compaction_markers``: text found in a compaction call's system prompt or last user message.
    ``continuation_markers``: text found in a user message of the root that starts from a compaction's summary
    (the harness's own preamble to it), for when the summary itself is carried in other words.
    ``title_markers``: text found in a title call's system prompt.
    """

    sub_agent_tools: Mapping[str, str] = field(default_factory=dict)
    compaction_markers: tuple[str, ...] = ()
    continuation_markers: tuple[str, ...] = ()
    title_markers: tuple[str, ...] = ()


@dataclass(frozen=True)
class HarnessContext:
    """Where and on what the harness runs; paths are as the harness sees them."""

    instruction: str
    instruction_file: str
    workdir: str
    home: str
    logs_dir: str
    model: str
    python: str  # an interpreter that has this package (the built-in agent runs on it)
    tools_dir: str = ""  # where the agent CLIs and Node are installed (polar harness install)
    sample_index: int = 0  # which of its task's samples this rollout is (0 .. num_samples - 1)


@dataclass(frozen=True)
class SessionAccess:
    """The harness's gateway session: its id, its secret key, the base URL per client family and the served
    model's context window in tokens (None when the gateway did not say: an older gateway)."""

    session_id: str
    api_key: str
    base_urls: Mapping[str, str]  # "openai" (…/v1), "anthropic" and "gemini" (the gateway root)
    context_length: int | None = None

    def rebased(self, root: str, new_root: str) -> SessionAccess:
        """The same session seen at ``new_root`` instead of ``root`` (the gateway's address inside a runtime)."""
        if root == new_root:
            return self
        urls = {
            name: new_root + url[len(root) :] if url.startswith(root) else url for name, url in self.base_urls.items()
        }
        return SessionAccess(self.session_id, self.api_key, urls, self.context_length)

    def provider_env(self) -> dict[str, str]:
        """The variables most model clients read, all pointing at the session."""
        return {
            "OPENAI_BASE_URL": self.base_urls["openai"],
            "OPENAI_API_KEY": self.api_key,
            "ANTHROPIC_BASE_URL": self.base_urls["anthropic"],
            "ANTHROPIC_API_KEY": self.api_key,
            "GOOGLE_GEMINI_BASE_URL": self.base_urls["gemini"],
            "GEMINI_API_KEY": self.api_key,
            "GOOGLE_API_KEY": self.api_key,
            "POLAR_SESSION_ID": self.session_id,
        }


@dataclass(frozen=True)
class LaunchSpec:
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)  # path (relative to the workdir, or absolute) -> content


def fill_placeholders(text: str, values: Mapping[str, str]) -> str:
    """``text`` with each ``{name}`` of ``values`` replaced; other braces (shell, Python, JSON) are left alone."""
    for name, value in values.items():
        text = text.replace("{" + name + "}", value)
    return text


class HarnessAdapter(Protocol):
    """``role_hints`` declares, as data, how this harness's side calls look (sub-agent launcher tools,
    compaction and title prompts), so the trajectory builders label its chains (``polar.trajectory.roles``)."""

    name: ClassVar[str]
    Config: ClassVar[type[BaseModel]]
    role_hints: RoleHints

    def setup_files(self, config: Any, ctx: HarnessContext) -> Mapping[str, str]:
        """Static files written at init (no secrets: the session does not exist yet)."""

    def launch(self, config: Any, ctx: HarnessContext, session: SessionAccess) -> LaunchSpec:
        """How to start the harness against ``session``."""

    def model_calls(self, config: Any) -> ModelCalls:
        """Whether this harness, configured by ``config``, calls the model (``ModelCalls``)."""
