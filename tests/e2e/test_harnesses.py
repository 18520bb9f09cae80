"""The real agent CLIs complete a multi-turn tool-using loop through the gateway, inside a network namespace.

For each CLI (tests/e2e/harnesses.py) the runner, inside ``unshare -n``, starts a gateway, creates a
session with a scripted policy and runs the CLI headless. Here we check, from the run's files and its
SQLite store:

- the namespace held only ``lo``, and (where a mount namespace lets us log DNS) the CLI tried to resolve
  no outside name beyond its documented allowance;
- the CLI exited 0 and printed the final reply, and the file the policy asked for exists with its content;
- every call left an OK capture with token ids and one logprob per sampled id;
- the calls that offer tools form ONE chain in the capture tree (root canonical, then parent_id links in
  append mode), and every other capture is a documented auxiliary root (e.g. OpenCode's title call);
- each chain link's sampled ids appear unchanged inside the next call's prompt, the sampled ids parse back
  into exactly the scripted tool calls, and the last prompt holds the output of the shell tool.

Needs: the CLIs (scripts/install_harnesses.sh), node, and permission to make a network namespace.
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness_adapters.npm_cli import fill
from polar.tokens.parsers.types import ParsedOutput
from tests.e2e.captures import Call, describe, load_calls
from tests.e2e.gateway import requests_in_log
from tests.e2e.harness_spec import FINAL, MARKER, Harness, placeholders
from tests.e2e.harnesses import HARNESSES, OTHER_RUNS
from tests.e2e.sandbox import Isolation, isolation

pytestmark = pytest.mark.e2e

CLI_TIMEOUT_S = 180

# Auxiliary calls a CLI makes besides its main loop; each must be a root with no children.
AUX_CALLS: dict[str, Callable[[Call], bool]] = {
    "title": lambda c: not c.tools and "title generator" in c.system,  # OpenCode, every run
    "router": lambda c: not c.tools and "Task Routing AI" in c.system,  # Gemini CLI without -m
}


@pytest.fixture(scope="module")
def isolated() -> Isolation:
    found = isolation()
    if found is None:
        pytest.skip("cannot create a network namespace here (`unshare -n` is not permitted or unshare/ip are missing)")
    return found


def _tail(path: Path, limit: int = 6000) -> str:
    if not path.exists():
        return f"({path.name}: missing)"
    text = path.read_text(errors="replace")
    return text if len(text) <= limit else "..." + text[-limit:]


def _show(run_dir: Path, proc: subprocess.CompletedProcess | None, calls_text: str = "") -> None:
    """Printed before the assertions; pytest shows it when the test fails."""
    print(f"==== run dir: {run_dir}")
    if proc is not None:
        print(f"==== runner exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    for name in ("result.json", "cli.stdout", "cli.stderr", "gateway.log"):
        print(f"==== {name}\n{_tail(run_dir / name)}")
    if calls_text:
        print(f"==== captures\n{calls_text}")


@dataclass(frozen=True)
class Reader:
    """How a run's ids read back: the toy model's Qwen3 format, or a real family's (``polar.chat``)."""

    decode: Callable[[list[int]], str]  # special tokens kept
    parse: Callable[[list[int]], ParsedOutput]
    expected: Callable[[dict], ParsedOutput]  # a scripted reply as the family writes and parses it


def _toy_reader(tokenizer) -> Reader:
    from polar.settings import Settings
    from polar.tokens.parsers import get_format

    fmt = get_format(Settings().tool_format)
    parse = lambda ids: fmt.parse(tokenizer.decode(ids, skip_special_tokens=True))  # noqa: E731
    return Reader(lambda ids: tokenizer.decode(ids, skip_special_tokens=False), parse, _as_scripted)


def _as_scripted(reply: dict) -> ParsedOutput:
    from polar.wire.policy import ScriptedReply

    message = ScriptedReply.model_validate(reply).message()
    return ParsedOutput(message.content, message.reasoning, message.tool_calls)


@pytest.mark.parametrize("name", list(HARNESSES))
def test_cli_tool_loop_through_gateway(name, isolated, request, small_tokenizer, tmp_path, e2e_timings):
    harness: Harness = HARNESSES[name]
    if not shutil.which("node"):
        pytest.skip("node is not installed")
    if not harness.installed:
        pytest.skip(f"{harness.package}@{harness.version} is not installed: run scripts/install_harnesses.sh")
    long_model_cache = request.getfixturevalue("long_model_cache")  # built only when a CLI will run
    run_and_check(name, harness, isolated, tmp_path / name, long_model_cache, e2e_timings, _toy_reader(small_tokenizer))


# Two CLIs (two protocols) on two real families: a model folder made by `polar model init`, served by
# `polar serve-model --model-path`, the gateway on --model-path (runner.py); the family writes and parses the ids.
FAMILY_RUNS = [("pi", "deepseek", "deepseek_v3"), ("codex-openai", "llama3", "llama3")]


@pytest.mark.parametrize(("name", "tokenizer", "family"), FAMILY_RUNS, ids=[f"{n}-{f}" for n, _, f in FAMILY_RUNS])
def test_cli_tool_loop_on_a_real_family(name, tokenizer, family, isolated, cache_dir, tmp_path, e2e_timings):
    harness: Harness = HARNESSES[name]
    if not shutil.which("node"):
        pytest.skip("node is not installed")
    if not harness.installed:
        pytest.skip(f"{harness.package}@{harness.version} is not installed: run scripts/install_harnesses.sh")
    from polar.chat import chat_format_for
    from polar.model_folder import open_model_folder
    from polar.models.init import TinyModelSpec, init_model_folder
    from polar.wire.policy import ScriptedReply

    # 64k positions: the CLIs send 6k-40k-token prompts.
    spec = TinyModelSpec(tokenizer=tokenizer, max_position_embeddings=65536)
    folder = init_model_folder(spec, tmp_path / f"tiny-{family}", cache_dir)
    fmt = chat_format_for(open_model_folder(folder))
    assert fmt.family == family
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast.from_pretrained(str(folder))
    reader = Reader(
        lambda ids: hf.decode(ids, skip_special_tokens=False),
        lambda ids: fmt.parse(ids),
        lambda reply: fmt.parse(fmt.reply_ids(ScriptedReply.model_validate(reply).message())),
    )
    run_and_check(name, harness, isolated, tmp_path / name, cache_dir, e2e_timings, reader, model_path=folder)


# Keep-alive with real CLIs: each reply held longer than HAProxy's idle timeout; the gateway's keep-alive bytes
# carry every call through (a cut call would be a 504 and a failed or retried CLI turn).
LB_IDLE_S, REPLY_DELAY_S = 2.0, 5.0


# Gemini CLI: google-genai's stream reader is the strictest about what may precede the first chunk.
@pytest.mark.parametrize("name", ["gemini"])
def test_cli_long_calls_through_an_idle_cutting_load_balancer(
    name, isolated, request, small_tokenizer, tmp_path, e2e_timings
):
    harness: Harness = HARNESSES[name]
    if not shutil.which("node"):
        pytest.skip("node is not installed")
    if not harness.installed:
        pytest.skip(f"{harness.package}@{harness.version} is not installed: run scripts/install_harnesses.sh")
    long_model_cache = request.getfixturevalue("long_model_cache")
    slow = ["--lb-idle", str(LB_IDLE_S), "--reply-delay", str(REPLY_DELAY_S)]
    reader = _toy_reader(small_tokenizer)
    calls = run_and_check(name, harness, isolated, tmp_path / name, long_model_cache, e2e_timings, reader, extra=slow)
    assert all(c.latency_s >= REPLY_DELAY_S > LB_IDLE_S for c in calls), [c.latency_s for c in calls]


def test_qwen_code_sends_no_background_memory_calls(isolated, request, tmp_path):
    """A turn that ends without a tool call (the first call gets the final text): with the adapter's ``memory``
    settings Qwen Code 0.24.4 sends that one call, and no memory extraction or dream call (with its defaults it
    sends an extraction call, a root of its own that takes a scripted reply, racing its own shutdown)."""
    harness = OTHER_RUNS["qwen-answer"]
    if not harness.installed:
        pytest.skip(f"{harness.package}@{harness.version} is not installed: run scripts/install_harnesses.sh")
    cache, run_dir = request.getfixturevalue("long_model_cache"), tmp_path / harness.name
    args = ["--harness", harness.name, "--run-dir", str(run_dir), "--cache", str(cache), "--timeout", "120"]
    proc = subprocess.run(isolated.command(args, run_dir), check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and (run_dir / "result.json").exists(), proc.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["exit_code"] == 0 and not result["timed_out"], _tail(run_dir / "cli.stderr")
    assert FINAL in (run_dir / "cli.stdout").read_text(errors="replace")
    calls = load_calls(result["database_url"], result["session_id"])
    assert [c.system.startswith("You are Qwen Code") for c in calls] == [True], describe(calls)


def _results(call: Call) -> list[dict]:
    """The blocks inside the ``tool_result`` blocks of an Anthropic request's last message."""
    content = call.request_json["messages"][-1]["content"]
    results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
    return [part for b in results if isinstance(b.get("content"), list) for part in b["content"]]


def run_and_check(
    name: str,
    harness: Harness,
    isolated: Isolation,
    run_dir: Path,
    cache: Path,
    e2e_timings: list[dict],
    reader: Reader,
    model_path: Path | None = None,
    extra: list[str] | None = None,
) -> list[Call]:
    """Run ``name`` through the runner and check everything above; the run's calls, for further checks."""
    args = [
        "--harness",
        name,
        "--run-dir",
        str(run_dir),
        "--cache",
        str(cache),
        "--timeout",
        str(CLI_TIMEOUT_S),
        *(["--model-path", str(model_path)] if model_path else []),
        *(extra or []),
    ]
    started = time.monotonic()
    proc = subprocess.run(
        isolated.command(args, run_dir), check=False, capture_output=True, text=True, timeout=CLI_TIMEOUT_S + 120
    )
    wall = time.monotonic() - started
    result_path = run_dir / "result.json"
    if proc.returncode != 0 or not result_path.exists():
        _show(run_dir, proc)
        pytest.fail(f"the runner failed (exit {proc.returncode}); see the output above")
    result = json.loads(result_path.read_text())
    calls = load_calls(result["database_url"], result["session_id"])
    _show(run_dir, None, describe(calls, reader))
    e2e_timings.append(
        {
            "harness": name,
            "wall_s": round(wall, 1),
            **{k: result[k] for k in ("startup_s", "cli_s", "total_s")},
            "calls": len(calls),
            "max_prompt": max((c.n_prompt for c in calls), default=0),
            "gateway_s": round(sum(c.latency_s or 0 for c in calls), 2),
        }
    )

    # -- isolation and phone-home
    links = [line.split(":")[1].strip() for line in result["ip_link"].splitlines() if line.strip()]
    assert links == ["lo"], f"the namespace must hold only lo, found {links}"
    if result["dns_lookups"] is not None:
        assert result["dns_probe_logged"], "the DNS logger did not see a lookup made inside the namespace"
        unexpected = sorted(set(result["dns_lookups"]) - set(harness.dns_allowed))
        assert not unexpected, f"{name} tried to resolve {unexpected} with telemetry/update switches off"

    # -- the CLI finished the task
    assert not result["timed_out"], f"{name} did not finish within {CLI_TIMEOUT_S} s"
    assert result["exit_code"] == 0, f"{name} exited {result['exit_code']}"
    hello = Path(result["workdir"]) / "hello.txt"
    assert hello.exists(), "the file the policy asked for was not written"
    assert hello.read_text() == harness.expected_content
    assert FINAL in (run_dir / "cli.stdout").read_text(errors="replace"), (
        "the final reply did not reach the CLI's output"
    )
    # Claude Code's JSON output reports the window it worked with: 1,000,000 for a name it does not know unless
    # told; a catalogued name (claude-sonnet-4-5) keeps its own window, the variable is read for others only.
    if harness.context_env and not harness.model.startswith("claude-"):
        usage = json.loads((run_dir / "cli.stdout").read_text())["modelUsage"]
        assert {u["contextWindow"] for u in usage.values()} == {result["context_length"]}, usage

    # -- the gateway saw only well-formed calls (a WebSocket attempt is refused before any POST)
    requests = requests_in_log(run_dir / "gateway.log")
    model_calls = [r for r in requests if r[0] == "POST" and not r[1].startswith("/v1/sessions")]
    assert model_calls and all(status == 200 for _, _, status in model_calls), model_calls
    websockets = [r for r in requests if r[0] == "WebSocket"]
    assert harness.websocket_first or not websockets, f"unexpected WebSocket attempts {websockets}"
    if harness.websocket_first:
        # One attempt, refused with 426 Upgrade Required, then HTTP at once (a 403 costs five retries first).
        assert websockets == [("WebSocket", "/v1/responses", 426)], (
            f"expected one refused WebSocket attempt, got {websockets}"
        )
        assert requests.index(websockets[0]) < requests.index(model_calls[0]), (
            "the CLI fell back to HTTP after the refusal"
        )

    # -- one capture per call, with token ids and logprobs
    assert len(calls) == len(model_calls)
    for c in calls:
        assert c.status == "OK", f"capture {c.id}: {c.error}"
        assert c.protocol == harness.protocol
        assert c.output_ids and len(c.output_ids) == len(c.output_logprobs)
        assert all(math.isfinite(lp) and lp <= 0 for lp in c.output_logprobs)
        assert len(c.prompt_ids) == c.n_prompt

    # -- the capture tree: the main loop is one chain; everything else is a documented auxiliary root
    main = [c for c in calls if c.tools]
    others = [c for c in calls if not c.tools]
    assert len(main) == len(harness.replies) + 1, f"expected {len(harness.replies)} tool turns and a final turn"
    assert main[0].parent_id is None and main[0].render_mode == "canonical"
    for parent, child in itertools.pairwise(main):
        assert child.parent_id == parent.id, f"capture {child.id} should extend {parent.id} (append mode)"
        assert child.render_mode == "append"
    children = {c.parent_id for c in calls if c.parent_id is not None}
    for c in others:
        kinds = [k for k in harness.aux_calls if AUX_CALLS[k](c)]
        assert kinds, (
            f"capture {c.id} (no tools, system {c.system[:80]!r}) is not a documented auxiliary call of {name}"
        )
        assert c.parent_id is None and c.id not in children, f"auxiliary capture {c.id} must be a separate root"
    for kind in harness.aux_calls:
        assert any(AUX_CALLS[kind](c) for c in others), f"{name} should have made its {kind!r} call"

    # -- token faithfulness along every link: turn k's sampled ids inside turn k+1's prompt
    by_id = {c.id: c for c in calls}
    for child in calls:
        if child.parent_id is None:
            continue
        parent = by_id[child.parent_id]
        sequence = parent.prompt_ids + parent.output_ids
        assert child.prefix_len == len(sequence), (
            f"capture {child.id} keeps {child.prefix_len} of {parent.id}'s {len(sequence)} ids"
        )
        assert child.prompt_ids[: len(sequence)] == sequence, (
            f"capture {child.id} does not extend {parent.id} token for token"
        )

    # -- the sampled ids are the scripted actions, and the tool output came back into the next prompt
    values = placeholders(home=Path("/"), workdir=Path(result["workdir"]), gateway="", key="", model=harness.model)
    for call, scripted in zip(main, fill(harness.replies, values), strict=False):  # main has one more: the final
        parsed, expected = reader.parse(call.output_ids), reader.expected(scripted)
        assert [(t.name, t.parsed_arguments()) for t in parsed.tool_calls] == [
            (t["name"], t["arguments"]) for t in scripted["tool_calls"]
        ]
        assert parsed.content.strip() == expected.content.strip()
        assert (parsed.reasoning or "").strip() == (expected.reasoning or "").strip()
    assert reader.parse(main[-1].output_ids).content.strip() == FINAL
    for tool in harness.loads_tools:  # not declared until the search loaded it; then declared and called
        (search,) = [i for i, c in enumerate(main) if {"type": "tool_reference", "tool_name": tool} in _results(c)]
        assert tool not in main[search - 1].tools and all(tool in c.tools for c in main[search:])
    last_prompt = reader.decode(main[-1].prompt_ids)
    assert MARKER in last_prompt, "the shell tool's output is missing from the last prompt"
    assert MARKER in json.dumps(main[-1].request_json), "the shell tool's output is missing from the last request"
    return calls
