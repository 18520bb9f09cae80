"""The toy task: reply with text whose letters are all from the first half of the alphabet (a to m).

The harness is a real program (the ``command`` harness running ``flows.demo_tasks.ONE_CALL_PY``) that makes one
Chat Completions call through its gateway session and writes the reply to reply.txt; a check script scores the
share of the reply's letters that are in a–m. A random tiny model scores about one half; a policy that learned
the task scores 1. The reward is dense, so a group of samples almost always has the variance GRPO needs. Given a
``seed``, every sample's call is seeded (see ``flows.demo_tasks``), so a run is reproducible.
"""

from __future__ import annotations

from typing import Any

from flows.demo_tasks import one_call_task

SCORE_SH = """\
python3 - <<'PY'
text = open("reply.txt").read().lower() if __import__("os").path.exists("reply.txt") else ""
letters = [c for c in text if "a" <= c <= "z"]
print(sum(c <= "m" for c in letters) / len(letters) if letters else 0.0)
PY
"""


def toy_task(*, step: int, group: int, samples: int, max_tokens: int = 12, seed: int | None = None) -> dict[str, Any]:
    """One group of the toy task for trainer step ``step``, its calls seeded from ``seed`` when given."""
    return one_call_task(
        name=f"first-half-{step}-{group}",
        instruction="Write a few words using only the letters a to m.",
        score_script=SCORE_SH,
        step=step,
        group=group,
        samples=samples,
        max_tokens=max_tokens,
        seed=seed,
        metadata={"toy": "first-half"},
    )
