"""A task whose harness retries its final call (the client timed out and sent the same body again), and the check
that a trainer adapter's sample of it is the chain the harness kept, each sampled token trained at most once and
the retried call's dead twin not trained (shared by the TRL and verl tests)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from examples.grpo.toy import toy_task
from polar.client import PolarClient

RETRY_PY = """\
import os
import openai

client = openai.OpenAI()
with open(os.environ["POLAR_INSTRUCTION_FILE"]) as f:
    messages = [{"role": "user", "content": f.read()}]
kw = dict(model=os.environ["POLAR_MODEL"], max_tokens=8, temperature=1.0)
first = client.chat.completions.create(messages=messages, **kw).choices[0].message.content or ""
messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "More."}]
client.chat.completions.create(messages=messages, **kw)  # its reply never reached the harness: sent again
last = client.chat.completions.create(messages=messages, **kw).choices[0].message.content or ""
with open("reply.txt", "w") as f:
    f.write(last)
"""


def retry_task(prompt: Any = None) -> dict[str, Any]:
    task = toy_task(step=0, group=0, samples=1)
    task["harness"]["config"] = {**task["harness"]["config"], "files": {"reply.py": RETRY_PY}}
    task["metadata"] = {"toy": "first-half"}  # no admission step: the trainer owns the weights here
    return task if prompt is None else {**task, "instruction": str(prompt)}


def check_kept_chain(client: PolarClient, rollout_id: str, completion_ids: list[int], loss_mask: list[int]) -> None:
    """What the adapter trained (``completion_ids``, ``loss_mask``) is the rollout's kept chain, and over all of
    its traces no sampled token is trained twice and the dead branch trains nothing."""
    traces = client.trajectories(rollout_id=rollout_id, builder="prefix_merge", tokens=True)
    assert len(traces) == 2  # the kept chain, and the final call's first reply as a dead branch
    (kept,) = [t for t in traces if t["kept"]]
    (dead,) = [t for t in traces if not t["kept"]]
    assert completion_ids == kept["response_ids"][: len(completion_ids)]
    assert loss_mask == kept["loss_mask"][: len(loss_mask)] and any(loss_mask)
    assert not any(dead["loss_mask"])
    # The dead branch holds the first reply of the retried call; the kept chain ends on the retry's reply.
    assert dead["response_ids"] != kept["response_ids"]
    trained = Counter(
        (i, lp)
        for t in traces
        for i, (lp, m) in enumerate(zip(t["response_logprobs"], t["loss_mask"], strict=True))
        if m
    )
    assert all(n == 1 for n in trained.values())
