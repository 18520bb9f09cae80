"""Multi-agent scenarios of the real CLIs (issue 16): a Claude Code sub-agent, compaction (Codex, OpenCode, Claude
Code), a title call.

Each is a variant of a harness in ``tests.e2e.harnesses`` (same install, same switches) with its own script
and, for compaction, the CLI's own setting that makes it compact early. The runner accepts these names too.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from tests.e2e.harness_spec import THINK, Harness, reply
from tests.e2e.harnesses import CLAUDE, CODEX, OPENCODE

# What tool-free calls (compaction, title) get: long enough to be recognised when a later call carries it.
SUMMARY = "Summary so far: hello.txt is being written; next, check it with cat."
SUB_PROMPT = "Run the check command and report what it printed."
# Only the shell can print this (the arguments hold "sub-%d" and 7).
SUB_CHECK = "printf ' sub-%d\\n' 7"
SUB_MARKER = "sub-7"

# Turn 1 (main) launches a sub-agent with the Agent tool; the sub-agent's own calls run the shell check and
# answer; then the main agent writes the file and finishes. Claude Code 2.1.332 runs sub-agents in the background
# by default: the main agent's next call (right after "Async agent launched") then races the sub-agent's first,
# and the scripted policy's cursor is the session's (each call offering tools takes the next reply, whichever
# chain it is on), so the replies would reach the two chains in either order. The script asks for the
# foreground (``run_in_background: false``, the Agent tool's own argument): the main agent waits for the
# sub-agent's report, as every sub-agent ran before 2.1.332, and the calls come in one order.
CLAUDE_SUBAGENT = replace(
    CLAUDE,
    name="claude-subagent",
    tool="claude",
    argv=[a if a != "Bash" else "Bash,Agent" for a in CLAUDE.argv],
    replies=[
        reply(
            "I will delegate the check.",
            "Agent",
            {
                "description": "Check hello",
                "prompt": SUB_PROMPT,
                "subagent_type": "general-purpose",
                "run_in_background": False,
            },
            reasoning=THINK,
        ),
        reply("Running it.", "Bash", {"command": SUB_CHECK, "description": "Run the check"}),
        reply("The check printed sub-7."),
        reply("I will create the file.", "Write", {"file_path": "{workdir}/hello.txt", "content": "hi"}),
    ],
)


def _with_config(harness: Harness, path: str, name: str, change: dict[str, Any]) -> Harness:
    """``harness`` with ``change`` merged into the config file at ``path`` (one level of nested dicts)."""
    fmt, data = harness.files[path]
    data = copy.deepcopy(data)
    for key, value in change.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return replace(harness, name=name, tool=harness.tool or harness.name, files={**harness.files, path: (fmt, data)})


# Codex compacts once a turn's usage passes model_auto_compact_token_limit.
CODEX_COMPACT = replace(
    _with_config(CODEX, ".codex/config.toml", "codex-compact", {"model_auto_compact_token_limit": 200}),
    tool_free_reply=SUMMARY,
)
# OpenCode compacts when a reply's prompt + output reach the model's context limit minus its output limit
# (11,600 - 1,000). Its system prompt alone is ~10.2k tokens, so the first reply is made long (reasoning) to
# pass that once; the post-compaction calls, with the history replaced by the summary, stay under it.
OPENCODE_COMPACT = _with_config(
    OPENCODE,
    ".config/opencode/opencode.json",
    "opencode-compact",
    {
        "provider": {
            "polar": {
                **OPENCODE.files[".config/opencode/opencode.json"][1]["provider"]["polar"],
                "models": {
                    "{model}": {"name": "{model}", "tool_call": True, "limit": {"context": 11600, "output": 1000}}
                },
            }
        }
    },
)
OPENCODE_COMPACT = replace(
    OPENCODE_COMPACT,
    tool_free_reply=SUMMARY,
    replies=[{**OPENCODE.replies[0], "reasoning": " ".join([THINK] * 20)}, *OPENCODE.replies[1:]],
)

# Claude Code 2.1.332 compacts when a prompt passes CLAUDE_AUTOCOMPACT_PCT_OVERRIDE percent of its effective window
# (CLAUDE_CODE_MAX_CONTEXT_TOKENS, the session's 65,536, less 20,000 for the output: 35% is 15,937 tokens), provided
# its fixed prefix (system prompt and tools, ~13.9k tokens) stays under that, or it calls compaction useless. For a
# model name it does not know it compacts "reactively", keeping the latest exchange verbatim: the first prompt
# (17.3k) leaves nothing to summarise, the third call is the compaction. It forks from the main conversation
# (the same system prompt, every tool, then a user message asking for an <analysis> and a <summary> block) and
# takes a scripted reply like any call offering tools, so the script holds the summary there. The CLI rewrites
# it into the next root (the analysis dropped, "<summary>" turned into "Summary:"), which then finishes the task.
CLAUDE_SUMMARY_BODY = (
    "1. Primary Request and Intent:\n   Create hello.txt containing hi, then show it with cat.\n\n"
    "2. Current Work:\n   hello.txt is written; next, check it with cat."
)
CLAUDE_SUMMARY = (
    "<analysis>\nThe user asked for hello.txt holding hi; the Write call made it.\n</analysis>\n\n"
    f"<summary>\n{CLAUDE_SUMMARY_BODY}\n</summary>"
)
CLAUDE_COMPACT = replace(
    CLAUDE,
    name="claude-compact",
    tool="claude",
    env={**CLAUDE.env, "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "35"},
    replies=[*CLAUDE.replies, reply(CLAUDE_SUMMARY)],
)

SCENARIOS: dict[str, Harness] = {h.name: h for h in (CLAUDE_SUBAGENT, CODEX_COMPACT, OPENCODE_COMPACT, CLAUDE_COMPACT)}
