"""A task whose harness retries its final call (its client gave up on a streamed reply after the first chunk and
sent the same body again), and the check that a trainer adapter's sample of it is the chain the harness kept, each
sampled token trained at most once and the abandoned copy (a cut stream: ``UNACKNOWLEDGED``, its partial ids on
record) not trained (shared by the TRL and verl tests)."""

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
stream = client.chat.completions.create(messages=messages, stream=True, **{**kw, "max_tokens": 64})
next(iter(stream))  # the client gives up after the first chunk (a read timeout) and sends the body again
stream.close()
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
    its traces no sampled token is trained twice and the abandoned copy trains nothing."""
    traces = client.trajectories(rollout_id=rollout_id, builder="prefix_merge", tokens=True)
    (kept,) = traces  # the cut copy is on record but in no trace: it was never a reply
    assert kept["kept"]
    assert completion_ids == kept["response_ids"][: len(completion_ids)]
    assert loss_mask == kept["loss_mask"][: len(loss_mask)] and any(loss_mask)
    (build,) = [b for b in client.rollout_stats(rollout_id)["builds"] if b["builder"] == "prefix_merge"]
    untrained = build["untrained_tokens"]
    assert untrained.get("unacknowledged", 0) > 0 and set(untrained) == {"unacknowledged"}
    trained = Counter(
        (i, lp)
        for t in traces
        for i, (lp, m) in enumerate(zip(t["response_logprobs"], t["loss_mask"], strict=True))
        if m
    )
    assert all(n == 1 for n in trained.values())
