"""Polar's built-in agent: a minimal tool-using loop over the OpenAI Chat Completions API.

    python -m harness_adapters.polar_agent --instruction-file task.md --model polar --max-turns 8

The client reads ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` (the gateway session). Each turn sends the whole
conversation with one tool, ``bash``; each tool call runs in the current folder and its output (truncated)
goes back as a tool message. The loop ends when a reply calls no tool or after ``--max-turns`` model calls.
Every turn is appended to ``--transcript`` as a JSON line. Exit codes: 0 finished (answer or turn limit),
1 the model API failed, 2 bad arguments. This module imports nothing from Polar: it runs inside the runtime.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a bash command in the task folder and return its exit code and output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "the command line"}},
            "required": ["command"],
        },
    },
}


def run_bash(arguments: str, *, timeout_s: float, limit: int) -> str:
    try:
        command = json.loads(arguments or "{}").get("command", "")
    except (json.JSONDecodeError, AttributeError):
        return "error: the arguments are not a JSON object with a 'command' string"
    if not isinstance(command, str) or not command.strip():
        return "error: empty command"
    try:
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return f"error: the command timed out after {timeout_s:g} s"
    output = (done.stdout + done.stderr)[-limit:]
    return f"exit code {done.returncode}\n{output}"


def _assistant_message(message: Any) -> dict[str, Any]:
    """The reply as the next request must echo it (content, and the tool calls with their ids)."""
    out: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in message.tool_calls
        ]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="polar_agent")
    parser.add_argument("--instruction-file", required=True)
    parser.add_argument("--model", default="polar")
    parser.add_argument("--max-turns", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--command-timeout", type=float, default=60.0)
    parser.add_argument("--output-limit", type=int, default=4000)
    parser.add_argument("--transcript", default="")
    args = parser.parse_args(argv)

    from openai import OpenAI, OpenAIError

    instruction = Path(args.instruction_file).read_text()
    system = os.environ.get("POLAR_AGENT_SYSTEM_PROMPT", "You are a coding agent. Use the bash tool.")
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": instruction}]
    client = OpenAI(max_retries=2, timeout=600)
    transcript = open(args.transcript, "a") if args.transcript else None
    try:
        for turn in range(args.max_turns):
            try:
                reply = client.chat.completions.create(
                    model=args.model,
                    messages=messages,  # type: ignore[arg-type]
                    tools=[BASH_TOOL],  # type: ignore[list-item]
                    max_tokens=args.max_tokens,
                    temperature=args.temperature,
                )
            except OpenAIError as exc:
                print(f"polar_agent: model call {turn} failed: {exc}", file=sys.stderr)
                return 1
            message = reply.choices[0].message
            messages.append(_assistant_message(message))
            results = []
            for call in message.tool_calls or []:
                if call.type != "function":  # the agent declares function tools only
                    continue
                output = run_bash(call.function.arguments, timeout_s=args.command_timeout, limit=args.output_limit)
                results.append({"role": "tool", "tool_call_id": call.id, "content": output})
            messages.extend(results)
            if transcript:
                record = {
                    "turn": turn,
                    "finish_reason": reply.choices[0].finish_reason,
                    "reply": messages[-1 - len(results)],
                    "tools": results,
                }
                transcript.write(json.dumps(record) + "\n")
                transcript.flush()
            if not results:
                return 0
        print(f"polar_agent: stopped at the turn limit ({args.max_turns})", file=sys.stderr)
        return 0
    finally:
        if transcript:
            transcript.close()


if __name__ == "__main__":
    sys.exit(main())
