"""The toy task: reply with text whose letters are all from the first half of the alphabet (a to m).

The harness is a real program (the ``command`` harness) that makes one Chat Completions call through its gateway
session (plain HTTP from the standard library: importing the OpenAI SDK cost more CPU than the rest of a rollout)
and writes the reply to reply.txt; a check script scores the share of the reply's letters that are in a–m.
A random tiny model scores about one half; a policy that learned the task scores 1. The reward is dense, so a
group of samples almost always has the variance GRPO needs.

Given a ``seed``, every call carries one (the OpenAI field; the gateway passes it to the backend as SGLang's
``sampling_params.seed``) derived from that seed, the step, the group and the sample's index in its task
(``POLAR_SAMPLE_INDEX``), so a run is reproducible: the same weights draw the same replies.
"""

from __future__ import annotations

from typing import Any

REPLY_PY = """\
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

SCORE_SH = """\
python3 - <<'PY'
text = open("reply.txt").read().lower() if __import__("os").path.exists("reply.txt") else ""
letters = [c for c in text if "a" <= c <= "z"]
print(sum(c <= "m" for c in letters) / len(letters) if letters else 0.0)
PY
"""


def toy_task(*, step: int, group: int, samples: int, max_tokens: int = 12, seed: int | None = None) -> dict[str, Any]:
    """One group of the toy task for trainer step ``step`` (admission control reads ``metadata.step``); with a
    ``seed``, its samples' calls are seeded from it, ``step``, ``group`` and their sample index."""
    env = {"TOY_MAX_TOKENS": str(max_tokens)}
    if seed is not None:
        env["TOY_SEED"] = f"{seed}/{step}/{group}"
    return {
        "name": f"first-half-{step}-{group}",
        "instruction": "Write a few words using only the letters a to m.",
        "harness": {
            "name": "command",
            "config": {
                "command": "{python} reply.py",
                "files": {"reply.py": REPLY_PY},
                "env": env,
            },
        },
        "evaluator": {"type": "script", "config": {"script": SCORE_SH}},
        "builder": "prefix_merge",
        "num_samples": samples,
        "timeout_s": 120,
        "metadata": {"step": step, "group": group, "toy": "first-half"},
    }
