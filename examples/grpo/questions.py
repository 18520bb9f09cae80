"""The real model's task: one-word answers to simple questions, for a small pretrained chat model.

Each group is one question ("What is the capital of France? Answer in one word."); the same harness as the toy
task (``toy.REPLY_PY``: one Chat Completions call through the rollout's gateway session, the reply written to
reply.txt) asks it at ``temperature`` with a budget of ``max_tokens``, and a check script scores 1 when the
expected word is among the reply's words, else 0. SmolLM2-135M-Instruct answers in a sentence and often runs out
of its budget before it names the answer, or names another one: about a third of its samples score at first, so
most groups have the spread GRPO learns from, and answering at once is what it can learn.

The questions are fixed (group ``g`` asks ``QUESTIONS[g]`` at every step), so the mean reward of a step is the
policy's success rate on one task set, step after step.
"""

from __future__ import annotations

import shlex
from typing import Any

from examples.grpo.toy import REPLY_PY

QUESTIONS: tuple[tuple[str, str], ...] = (
    ("What is the capital of France?", "paris"),
    ("What color is the sky on a clear day?", "blue"),
    ("What is the opposite of hot?", "cold"),
    ("What is frozen water called?", "ice"),
    ("What do bees make?", "honey"),
    ("What color is grass?", "green"),
    ("What is the opposite of up?", "down"),
    ("What is the capital of Italy?", "rome"),
)

SCORE_SH = """\
python3 - {answer} <<'PY'
import os, re, sys
text = open("reply.txt").read().lower() if os.path.exists("reply.txt") else ""
print(1.0 if sys.argv[1] in re.findall(r"[a-z]+", text) else 0.0)
PY
"""


def question_task(
    *, step: int, group: int, samples: int, max_tokens: int = 8, temperature: float = 0.7, seed: int | None = None
) -> dict[str, Any]:
    """Group ``group`` of trainer step ``step``: question ``group`` (mod the set), ``samples`` samples."""
    question, answer = QUESTIONS[group % len(QUESTIONS)]
    env = {"TOY_MAX_TOKENS": str(max_tokens), "TOY_TEMPERATURE": str(temperature)}
    if seed is not None:
        env["TOY_SEED"] = f"{seed}/{step}/{group}"
    return {
        "name": f"one-word-{step}-{group}",
        "instruction": f"{question} Answer in one word.",
        "harness": {
            "name": "command",
            "config": {"command": "{python} reply.py", "files": {"reply.py": REPLY_PY}, "env": env},
        },
        "evaluator": {"type": "script", "config": {"script": SCORE_SH.format(answer=shlex.quote(answer))}},
        "builder": "prefix_merge",
        "num_samples": samples,
        "timeout_s": 300,
        "metadata": {"step": step, "group": group, "task": "one-word", "answer": answer},
    }
