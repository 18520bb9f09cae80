"""A finished Polar task as a group of per-sample token sequences, the shape RL trainers consume.

Trainer-agnostic: ``fetch_group`` reads one task's rollouts and trajectories through ``polar.client`` and returns
one ``Sample`` per rollout, in sample order, with ``prompt_ids``, ``completion_ids`` (the merged trajectory's
response: sampled tokens and the inserted tool/user tokens between turns), ``loss_mask`` (1 on sampled tokens,
0 on inserted ones) and the captured ``logprobs``, all aligned, with the chain's ``sampling_spans`` (the sampling
regime of each span of sampled tokens; ``polar.integrations.sampling`` masks what a trainer cannot weigh).

Masking rule (a sample that cannot train keeps real token ids but ``loss_mask`` all 0 and ``reward=None``):
- its rollout did not finish trainable (ERROR, deadline TIMEOUT, CANCELLED: the store's fail-closed filter already
  zeroed its mask), or its builder made no trajectory for it;
- it was drawn more than ``max_staleness`` registered weight versions behind the current one.
A group in which no sample can train raises ``GroupFailed``: a trainer never gets tensors for it.

One rollout may hold several chains (sub-agents, side calls, retries, rewritten history); a trainer with one
completion per sample gets the chain the harness kept (``kept``: found by the builder from what the harness
continued, ``polar.trajectory.liveness``, never from token counts), and ``chains`` says how many there were. Each
sampled token is trained in one trace only, so the kept chain's tokens are never also trained elsewhere here. A
rollout with no kept chain (its shape is ambiguous: every call poisoned or none live) is masked with that reason.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from polar.client import PolarClient
from polar.errors import GroupFailed, InvalidRequest, PolarError, TokenizerMismatch
from polar.tokens.tokenizer import vocab_fingerprint


class HasVocab(Protocol):
    def get_vocab(self) -> dict[str, int]: ...


@dataclass(frozen=True)
class Sample:
    rollout_id: str
    sample_index: int
    status: str  # the rollout's final status
    prompt_ids: list[int]
    completion_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    reward: float | None  # None: the sample is masked and must not train (``masked_reason`` says why)
    weight_version_min: str | None
    weight_version_max: str | None
    chains: int
    masked_reason: str | None = None
    trajectory_id: int | None = None  # the chain's trajectory (its extras: polar.integrations.extras)
    # The chain's sampling regime per response span (polar.trajectory.sampling; None: not recorded), and what
    # polar.integrations.sampling masked for a trainer that weighs the stored logprobs (None: nothing).
    sampling_spans: list[dict[str, Any]] | None = None
    sampling_masked: str | None = None

    @property
    def trainable(self) -> bool:
        return self.reward is not None


def check_tokenizer(client: PolarClient, tokenizer: HasVocab) -> dict[str, Any]:
    """Refuse to train with a tokenizer other than the one Polar's gateways use; returns the served model's info."""
    served = client.model()
    theirs = served["tokenizer"]
    vocab = tokenizer.get_vocab()
    ours = vocab_fingerprint(vocab)
    if ours != theirs["fingerprint"]:
        raise TokenizerMismatch(
            f"the trainer's tokenizer ({len(vocab)} ids, vocabulary sha256 {ours[:12]}) is not the one Polar serves "
            f"for model {served['model']!r} ({theirs['name']}, {theirs['vocab_size']} ids, sha256 "
            f"{theirs['fingerprint'][:12]}): token ids would not line up; load the trainer's tokenizer from the "
            "served model's folder",
            field="tokenizer",
        )
    return served


def prompt_text(prompt: Any) -> str:
    """A dataset prompt as instruction text: a string as is, a conversation as its last user message."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], Mapping):
        content = prompt[-1].get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    raise InvalidRequest(f"cannot read an instruction from prompt {prompt!r:.200}", field="prompt")


def version_ordinals(client: PolarClient) -> dict[str, int]:
    """Registered weight versions by name -> ordinal (1 = the first registered)."""
    return {v["version"]: int(v["ordinal"]) for v in client.weights()["versions"]}


def fetch_group(
    client: PolarClient,
    task: Mapping[str, Any],
    *,
    ordinals: Mapping[str, int],
    max_staleness: int | None = None,
    fallback_prompt_ids: list[int] | None = None,
    pad_id: int = 0,
    require_trainable: bool = True,
) -> list[Sample]:
    """The samples of the finished task ``task`` (its view from ``client.task``), masked as the module says.

    ``fallback_prompt_ids`` and ``pad_id`` fill a rollout that left no trajectory at all (one masked pad token,
    so every sample has a non-empty completion). Raises ``GroupFailed`` when no sample can train, unless
    ``require_trainable`` is false (a trainer that groups samples itself)."""
    rows = client.trajectories(task_id=task["task_id"], builder=task["builder"], tokens=True, limit=10_000)
    by_rollout: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_rollout[row["rollout_id"]].append(row)
    current = max(ordinals.values(), default=0)
    samples = [
        _sample(rollout, by_rollout.get(rollout["rollout_id"], []), ordinals, current, max_staleness)
        if by_rollout.get(rollout["rollout_id"])
        else _no_trajectory(rollout, fallback_prompt_ids or [], pad_id)
        for rollout in sorted(task["rollouts"], key=lambda r: r["sample_index"])
    ]
    samples = [s if s.completion_ids else _pad(s, pad_id) for s in samples]
    if require_trainable and not any(s.trainable for s in samples):
        reasons = "; ".join(
            f"sample {s.sample_index} {s.status}: {s.masked_reason}" for s in samples[:8] if s.masked_reason
        )
        raise GroupFailed(
            f"task {task['task_id']} ({task.get('name')}): none of its {len(samples)} samples can train ({reasons})",
            field="task_id",
        )
    return samples


def _sample(
    rollout: Mapping[str, Any],
    chains: list[dict[str, Any]],
    ordinals: Mapping[str, int],
    current: int,
    max_staleness: int | None,
) -> Sample:
    for chain in chains:
        n = len(chain["response_ids"])
        if len(chain["loss_mask"]) != n or len(chain["response_logprobs"]) != n:
            raise PolarError(f"trajectory {chain['id']}: response ids, loss mask and logprobs do not align")
    kept = [c for c in chains if c.get("kept")]
    best = kept[0] if len(kept) == 1 else min(chains, key=lambda c: c["chain_index"])
    reason = None
    if len(kept) != 1:
        reason = f"no kept chain among {len(chains)} (ambiguous shape: every call poisoned or none live)"
    elif not any(best["loss_mask"]):
        reason = f"no trainable tokens ({best['filter_reason'] or 'mask all 0'})"
    elif best["reward"] is None:
        reason = "no reward"
    elif max_staleness is not None and best["weight_version_min"] is not None:
        behind = current - ordinals.get(best["weight_version_min"], 0)
        if behind > max_staleness:
            reason = (
                f"stale: drawn under {best['weight_version_min']!r}, {behind} versions behind (max {max_staleness})"
            )
    return Sample(
        rollout_id=rollout["rollout_id"],
        sample_index=rollout["sample_index"],
        status=rollout["status"],
        prompt_ids=list(best["prompt_ids"]),
        completion_ids=list(best["response_ids"]),
        loss_mask=[0] * len(best["loss_mask"]) if reason else list(best["loss_mask"]),
        logprobs=[float(x) for x in best["response_logprobs"]],
        reward=None if reason else float(best["reward"]),
        weight_version_min=best["weight_version_min"],
        weight_version_max=best["weight_version_max"],
        chains=len(chains),
        masked_reason=reason,
        trajectory_id=best.get("id"),
        sampling_spans=best.get("sampling_spans"),
    )


def _no_trajectory(rollout: Mapping[str, Any], prompt_ids: list[int], pad_id: int) -> Sample:
    error = rollout.get("error")
    return Sample(
        rollout_id=rollout["rollout_id"],
        sample_index=rollout["sample_index"],
        status=rollout["status"],
        prompt_ids=list(prompt_ids),
        completion_ids=[pad_id],
        loss_mask=[0],
        logprobs=[0.0],
        reward=None,
        weight_version_min=None,
        weight_version_max=None,
        chains=0,
        masked_reason="no trajectory" + (f" ({str(error)[:200]})" if error else ""),
    )


def _pad(sample: Sample, pad_id: int) -> Sample:
    """An empty completion (a reply of no tokens) as one masked pad token: trainers index the last token."""
    return replace(sample, completion_ids=[pad_id], loss_mask=[0], logprobs=[0.0], reward=None, masked_reason="empty")
