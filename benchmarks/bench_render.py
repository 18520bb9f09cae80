"""Per-turn prompt cost (render + tokenize) in append mode vs canonical mode, as a conversation grows.

One agent conversation of 200 turns (assistant tool call → tool result of ~400 characters). At turns
1, 50 and 200 it times building the next prompt: append mode (find the parent among all earlier calls,
render and tokenize only the new messages) vs canonical mode (render and tokenize everything).

    .venv/bin/python benchmarks/bench_render.py [--tokenizer small|qwen]
    .venv/bin/python benchmarks/bench_render.py --families qwen3,deepseek_v3,llama3,gpt_oss

``--families``: the same conversation through each family's chat format (polar/chat) on its real vocabulary (with
``--opening N``, after a system prompt of about N more tokens: a long session's context), in a
tiny model folder made by ``polar model init``'s code: append = ``extend(previous prompt, sampled ids, new
messages)``, canonical = ``render_ids(whole conversation)``; the sampled ids of each turn are the reply's
canonical encoding. ``fallbacks`` counts turns where the format could not extend (then the prompt was rendered
canonically).
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


FAMILY_VOCABULARY = {"qwen3": "qwen", "qwen3_coder": "qwen", "deepseek_v3": "deepseek", "llama3": "llama3"}
FAMILY_VOCABULARY["gpt_oss"] = "o200k_harmony"


def bench_families(families: list[str], repeat: int, opening: int = 0) -> None:
    import tempfile
    from pathlib import Path

    from polar.chat import chat_format_for
    from polar.model_folder import open_model_folder
    from polar.models.init import TinyModelSpec, init_model_folder

    cache = get_settings().cache_dir
    print(f"median of {repeat}; prompt = previous prompt + sampled ids + new messages (append) vs whole render")
    print(f"{'family':>12} {'turn':>5} {'prompt tokens':>14} {'append ms':>10} {'canonical ms':>13} {'ratio':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for family in families:
            spec = TinyModelSpec(tokenizer=FAMILY_VOCABULARY[family], chat_format=family)
            fmt = chat_format_for(open_model_folder(init_model_folder(spec, Path(tmp) / family, cache)))
            context = "".join(f"line {i}: def f{i}(x): return x * {i}\n" for i in range(opening // 14))
            messages: list[Message] = [system("You are a coding agent. " * 40 + context), user("Refactor the repo.")]
            head = [system("You are a coding agent."), messages[1]]  # the reply's ids do not depend on the context
            prompt = fmt.render_ids(messages, (BASH,))
            fallbacks = 0
            for turn in range(1, max(CHECKPOINTS) + 1):
                reply = assistant(
                    "", tool_calls=(ToolCall("bash", json.dumps({"cmd": f"ls -la src/{turn}"}), f"c{turn}"),)
                )
                short = fmt.render_ids(head, (BASH,))
                sampled = fmt.render_ids([*head, reply], (BASH,), add_generation_prompt=False)[len(short) :]
                new = [tool_result(tool_output(turn), f"c{turn}")]
                whole = [*messages, reply, *new]
                if turn in CHECKPOINTS:
                    append_s = timed(lambda p=prompt, s=sampled, n=new, f=fmt: f.extend(p, s, n, (BASH,)), repeat)
                    canonical_s = timed(lambda w=whole, f=fmt: f.render_ids(w, (BASH,)), repeat)
                    print(
                        f"{family:>12} {turn:>5} {len(prompt):>14} {append_s * 1e3:>10.2f} "
                        f"{canonical_s * 1e3:>13.2f} {canonical_s / append_s:>7.1f}x"
                    )
                extended = fmt.extend(prompt, sampled, new, (BASH,))
                if extended is None:
                    fallbacks += 1
                    extended = fmt.render_ids(whole, (BASH,))
                prompt, messages = extended, whole
            print(f"{family:>12} fallbacks to canonical: {fallbacks} of {max(CHECKPOINTS)} turns")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokenizer", default="qwen", choices=["small", "qwen"])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--families", help="comma-separated chat formats, e.g. qwen3,deepseek_v3,llama3,gpt_oss")
    parser.add_argument("--opening", type=int, default=0, help="--families: about this many more tokens up front")
    args = parser.parse_args()
    if args.families:
        bench_families(args.families.split(","), args.repeat, args.opening)
        return
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
