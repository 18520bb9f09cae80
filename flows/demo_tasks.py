"""The demo's tasks, and the one-call harness script the GRPO examples share.

``toy_tasks``: three tasks for the built-in agent on scripted gateway policies (the tiny random model cannot act;
its scripted replies still become real token ids scored by it). ``question_task``: one-word answers to simple
questions for a real chat model sampling freely (SmolLM2-135M-Instruct), asked by ``ONE_CALL_PY``, a harness
that makes one Chat Completions call through its gateway session (plain HTTP from the standard library: importing
the OpenAI SDK cost more CPU than the rest of a rollout) and writes the reply to reply.txt, and scored 1 when the
expected word is among the reply's words, else 0. SmolLM2 answers in a sentence and often runs out of its budget
before it names the answer, or names another one: about a third of its samples score at first, so most groups
have the spread GRPO learns from, and answering at once is what it can learn (``examples.grpo``).

Given a ``seed``, every call of ``ONE_CALL_PY`` carries one (the OpenAI field; the gateway passes it to the
backend as SGLang's ``sampling_params.seed``) derived from the seed, the step, the group and the sample's index in
its task (``POLAR_SAMPLE_INDEX``), so a run is reproducible: the same weights draw the same replies.
"""

from __future__ import annotations

import shlex
from typing import Any

GIT_COMMIT = "git init -q . && git add -A && git -c user.email=demo@polar -c user.name=polar commit -q -m start"


def _bash(command: str) -> dict[str, Any]:
    return {"content": "", "tool_calls": [{"name": "bash", "arguments": {"command": command}}]}


def _script(*commands: str) -> dict[str, Any]:
    return {"type": "scripted", "replies": [*(_bash(c) for c in commands), {"content": "Done."}]}


def toy_tasks(samples: int) -> list[dict[str, Any]]:
    """Three toy tasks; sample i is scripted to solve its task when i is even and to fail it when i is odd."""
    agent = {"name": "agent", "config": {"max_turns": 4}}
    return [
        {
            "name": "write-file",
            "instruction": "Create a file answer.txt that contains the word polar.",
            "harness": agent,
            "evaluator": {"type": "file", "config": {"path": "answer.txt", "equals": "polar"}},
            "num_samples": samples,
            "policies": [_script("echo polar > answer.txt"), _script("echo polaris > answer.txt")],
        },
        {
            "name": "fix-bug",
            "instruction": "add() in calc.py returns the wrong result. Fix it.",
            "harness": agent,
            "runtime": {
                "prepare": [
                    {"type": "write_file", "path": "calc.py", "content": "def add(a, b):\n    return a - b\n"},
                    {"command": GIT_COMMIT},
                ]
            },
            # Graded in a fresh runtime, prepared while the agent runs, with the agent's diff applied.
            "evaluator": {
                "type": "tests",
                "fresh_runtime": True,
                "config": {
                    "command": "{python} -m pytest -q -p no:cacheprovider test_calc.py",
                    "files": {"test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"},
                },
            },
            "num_samples": samples,
            "policies": [
                _script("cat calc.py", "sed -i 's/a - b/a + b/' calc.py"),
                _script("echo '# checked' >> calc.py"),
            ],
        },
        {
            "name": "count-lines",
            "instruction": "Write the number of lines of data.txt into count.txt.",
            "harness": agent,
            "runtime": {"prepare": [{"type": "write_file", "path": "data.txt", "content": "alpha\nbeta\ngamma\n"}]},
            "evaluator": {"type": "command", "config": {"command": "test \"$(tr -d ' ' < count.txt)\" = 3"}},
            "num_samples": samples,
            "policies": [_script("wc -l < data.txt > count.txt"), _script("echo 4 > count.txt")],
        },
    ]


ONE_CALL_PY = """\
import json
import os
import urllib.request
import zlib

with open(os.environ["POLAR_INSTRUCTION_FILE"]) as f:
    instruction = f.read()
body = {
    "model": os.environ["POLAR_MODEL"],
    "messages": [{"role": "user", "content": instruction}],
    "max_tokens": int(os.environ.get("TOY_MAX_TOKENS", "12")),
    "temperature": float(os.environ.get("TOY_TEMPERATURE", "1.0")),
}
if "TOY_SEED" in os.environ:  # a reproducible run: one seed per sample
    key = f"{os.environ['TOY_SEED']}/{os.environ['POLAR_SAMPLE_INDEX']}"
    body["seed"] = zlib.crc32(key.encode()) & 0x7FFFFFFF
request = urllib.request.Request(  # OPENAI_BASE_URL and OPENAI_API_KEY point at this rollout's gateway session
    os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
    data=json.dumps(body).encode(),
    headers={"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
)
with urllib.request.urlopen(request, timeout=100) as response:
    reply = json.load(response)
with open("reply.txt", "w") as f:
    f.write(reply["choices"][0]["message"]["content"] or "")
"""

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

SCORE_ANSWER_SH = """\
python3 - {answer} <<'PY'
import os, re, sys
text = open("reply.txt").read().lower() if os.path.exists("reply.txt") else ""
print(1.0 if sys.argv[1] in re.findall(r"[a-z]+", text) else 0.0)
PY
"""


def one_call_task(
    *,
    name: str,
    instruction: str,
    score_script: str,
    step: int,
    group: int,
    samples: int,
    max_tokens: int,
    temperature: float = 1.0,
    seed: int | None = None,
    timeout_s: float = 120,
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A group whose harness is ``ONE_CALL_PY`` (one call of at most ``max_tokens`` at ``temperature``) and whose
    reward is what ``score_script`` prints, for trainer step ``step`` (admission control reads ``metadata.step``);
    with a ``seed``, its samples' calls are seeded from it, ``step``, ``group`` and their sample index."""
    env = {"TOY_MAX_TOKENS": str(max_tokens), "TOY_TEMPERATURE": str(temperature)}
    if seed is not None:
        env["TOY_SEED"] = f"{seed}/{step}/{group}"
    return {
        "name": name,
        "instruction": instruction,
        "harness": {
            "name": "command",
            "config": {"command": "{python} reply.py", "files": {"reply.py": ONE_CALL_PY}, "env": env},
        },
        "evaluator": {"type": "script", "config": {"script": score_script}},
        "builder": "prefix_merge",
        "num_samples": samples,
        "timeout_s": timeout_s,
        "metadata": {"step": step, "group": group, **(metadata or {})},
    }


def question_task(
    *, step: int, group: int, samples: int, max_tokens: int = 8, temperature: float = 0.7, seed: int | None = None
) -> dict[str, Any]:
    """Group ``group`` of trainer step ``step``: question ``group`` (mod the set), ``samples`` samples."""
    question, answer = QUESTIONS[group % len(QUESTIONS)]
    return one_call_task(
        name=f"one-word-{step}-{group}",
        instruction=f"{question} Answer in one word.",
        score_script=SCORE_ANSWER_SH.format(answer=shlex.quote(answer)),
        step=step,
        group=group,
        samples=samples,
        max_tokens=max_tokens,
        temperature=temperature,
        seed=seed,
        timeout_s=300,
        metadata={"task": "one-word", "answer": answer},
    )


def real_tasks(samples: int) -> list[dict[str, Any]]:
    """The demo's real part: two questions for the real model, ``samples`` samples each, sampled freely."""
    return [question_task(step=0, group=g, samples=samples) for g in range(2)]
