"""Per-turn prompt cost (render + tokenize) in append mode vs canonical mode, as a conversation grows.

One agent conversation of 200 turns (assistant tool call → tool result of ~400 characters). At turns
1, 50 and 200 it times building the next prompt: append mode (find the parent among all earlier calls,
render and tokenize only the new messages) vs canonical mode (render and tokenize everything).

    .venv/bin/python benchmarks/bench_render.py [--tokenizer small|qwen]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from polar.settings import RenderMode, get_settings
from polar.tokens.messages import Message, ToolCall, ToolSpec, assistant, system, tool_result, user
from polar.tokens.render import PriorCall, PromptBuilder
from polar.tokens.tokenizer import load_tokenizer

BASH = ToolSpec("bash", "Run a shell command", {"type": "object", "properties": {"cmd": {"type": "string"}}})
CHECKPOINTS = (1, 50, 200)


def tool_output(turn: int) -> str:
    return "\n".join(f"-rw-r--r-- 1 root root {turn * 37 + i:>6} Nov 29 12:00 file_{turn}_{i}.py" for i in range(8))


def timed(fn, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokenizer", default="qwen", choices=["small", "qwen"])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    tokenizer = load_tokenizer(args.tokenizer, get_settings().cache_dir)
    builder = PromptBuilder(tokenizer)
    messages: list[Message] = [system("You are a coding agent. " * 40), user("Refactor the repository.")]
    prior: list[PriorCall] = []
    rows = []
    for turn in range(1, max(CHECKPOINTS) + 1):
        prompt = builder.build(messages, (BASH,), prior)
        if turn in CHECKPOINTS:
            append_s = timed(lambda m=messages, p=prior: builder.build(m, (BASH,), p), args.repeat)
            canonical_s = timed(
                lambda m=messages: builder.build(m, (BASH,), (), mode=RenderMode.CANONICAL), args.repeat
            )
            rows.append((turn, len(prompt.ids), append_s, canonical_s))
        reply = assistant(
            f"Step {turn}.", tool_calls=(ToolCall("bash", json.dumps({"cmd": f"ls -la src/{turn}"}), f"c{turn}"),)
        )
        output_ids = tuple(tokenizer.encode(builder.template.assistant_body(reply))) + (tokenizer.im_end_id,)
        prior.append(PriorCall(tuple(messages), (BASH,), reply, prompt.ids, output_ids))
        messages += [reply, tool_result(tool_output(turn), f"c{turn}")]
    print(
        f"tokenizer={args.tokenizer}  median of {args.repeat}  (append: parent search over all earlier calls included)"
    )
    print(f"{'turn':>5} {'prompt tokens':>14} {'append ms':>10} {'canonical ms':>13} {'canonical/append':>17}")
    for turn, n, append_s, canonical_s in rows:
        print(f"{turn:>5} {n:>14} {append_s * 1e3:>10.2f} {canonical_s * 1e3:>13.2f} {canonical_s / append_s:>16.1f}x")


if __name__ == "__main__":
    main()
