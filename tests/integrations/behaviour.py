"""Stored trajectories whose behaviour logprobs differ from a trainer's recompute by known amounts, and a stand-in
for the control API that serves them to the trainer adapters (``polar.integrations.trl`` / ``.verl``).

Each trajectory's response is sampled-looking ids, then a few inserted (tool) ids, then more sampled-looking ids;
``response_logprobs`` on a sampled position ``j`` is the fp32 transformers recompute of that token minus
``DELTAS[j % len(DELTAS)]``, and 0.0 on inserted ones (as Polar stores them). The truncated importance weight a
trainer should then give a sampled token is ``min(exp(delta), cap)``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DELTAS = (0.0, 0.25, -0.5, 1.5, -1.0, 0.9)  # trainer - behaviour, per sampled token, in turn
CAP = 2.0


@dataclass(frozen=True)
class Stored:
    """One stored trajectory and what its trainer recomputes."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    response_logprobs: list[float]  # the behaviour logprobs Polar stores
    recompute: list[float]  # the trainer's fp32 logprob of every response id
    deltas: list[float]  # recompute - behaviour on sampled ids, 0.0 on inserted ones
    reward: float
    sampling_spans: list[dict[str, Any]] | None = None  # None: every sampled id at temperature 1 (sampled_at)


def build(model_dir: Path, shapes: Sequence[tuple[int, int, int, int]], seed: int = 0) -> list[Stored]:
    """One trajectory per ``(prompt, sampled, inserted, sampled)`` length tuple, ids drawn with ``seed``."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(seed)
    vocab = min(int(model.config.vocab_size), 1000)
    out: list[Stored] = []
    for i, (n_prompt, first, inserted, second) in enumerate(shapes):
        ids = torch.randint(3, vocab, (n_prompt + first + inserted + second,), generator=generator).tolist()
        prompt, response = ids[:n_prompt], ids[n_prompt:]
        mask = [1] * first + [0] * inserted + [1] * second
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, n_prompt - 1 : -1].float()
        recompute = torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None])[:, 0].tolist()
        deltas = [DELTAS[j % len(DELTAS)] if m else 0.0 for j, m in enumerate(mask)]
        behaviour = [r - d if m else 0.0 for r, d, m in zip(recompute, deltas, mask, strict=True)]
        out.append(Stored(prompt, response, mask, behaviour, recompute, deltas, reward=float(i % 2)))
    return out


def token_weight(delta: float, cap: float = CAP) -> float:
    """Token-level truncated IS: ``min(exp(trainer - behaviour), cap)``."""
    return min(math.exp(delta), cap)


def sequence_weight(deltas: Iterable[float], cap: float = CAP) -> float:
    """Sequence-level truncated IS: ``min(exp(sum(trainer - behaviour)), cap)``."""
    return min(math.exp(sum(deltas)), cap)


def sampled_at(mask: Sequence[int], temperature: float, **regime: Any) -> list[dict[str, Any]]:
    """Sampling spans (``polar.trajectory.sampling``) over each run of 1s in ``mask``, all in one regime."""
    spans: list[dict[str, Any]] = []
    for i, m in enumerate(mask):
        if m and spans and spans[-1]["end"] == i:
            spans[-1]["end"] = i + 1
        elif m:
            spans.append({"start": i, "end": i + 1, "temperature": temperature, "top_p": 1.0, "top_k": -1})
            spans[-1] |= {"min_p": 0.0, "logprob_semantics": "temperature_scaled", "greedy": False, **regime}
    return spans


def dump(stored: Sequence[Stored], path: Path) -> Path:
    path.write_text(json.dumps([asdict(s) for s in stored]))
    return path


def load(path: Path) -> list[Stored]:
    return [Stored(**row) for row in json.loads(path.read_text())]


class FakeControlAPI:
    """The ``PolarClient`` calls the adapters make, answered from ``stored``: each submitted task takes the next
    ``num_samples`` trajectories (round robin), every rollout COMPLETED with one kept chain."""

    def __init__(self, stored: Sequence[Stored], fingerprint: str):
        self.stored = list(stored)
        self.fingerprint = fingerprint
        self.versions: list[str] = []
        self.tasks: dict[str, list[int]] = {}  # task id -> indexes into stored
        self._next = 0

    def model(self) -> dict[str, Any]:
        return {"model": "tiny", "tokenizer": {"fingerprint": self.fingerprint, "name": "tiny", "vocab_size": 0}}

    def register_weights(self, version: str, **_: Any) -> dict[str, Any]:
        self.versions.append(version)
        return {"version": version}

    def weights(self) -> dict[str, Any]:
        versions = [{"version": v, "ordinal": i + 1} for i, v in enumerate(self.versions)]
        return {"versions": versions, "current": self.versions[-1] if self.versions else None}

    def submit(self, tasks: Sequence[dict[str, Any]]) -> list[str]:
        ids = []
        for task in tasks:
            task_id = f"task-{len(self.tasks)}"
            n = int(task.get("num_samples", 1))
            self.tasks[task_id] = [(self._next + k) % len(self.stored) for k in range(n)]
            self._next += n
            ids.append(task_id)
        return ids

    def wait(self, task_ids: Sequence[str], **_: Any) -> list[dict[str, Any]]:
        return [self._view(task_id) for task_id in task_ids]

    def _view(self, task_id: str) -> dict[str, Any]:
        rollouts = [
            {"rollout_id": f"{task_id}-r{k}", "sample_index": k, "status": "COMPLETED"}
            for k in range(len(self.tasks[task_id]))
        ]
        return {"task_id": task_id, "name": task_id, "builder": "prefix_merge", "rollouts": rollouts}

    def trajectories(
        self, *, task_id: str | None = None, rollout_id: str | None = None, **_: Any
    ) -> list[dict[str, Any]]:
        rows = []
        for tid, indexes in self.tasks.items():
            for k, index in enumerate(indexes):
                rid = f"{tid}-r{k}"
                if (task_id is None or tid == task_id) and (rollout_id is None or rid == rollout_id):
                    rows.append(self._row(rid, index))
        return rows

    def _row(self, rollout_id: str, index: int) -> dict[str, Any]:
        s = self.stored[index]
        return {
            "id": index + 1,
            "rollout_id": rollout_id,
            "chain_index": 0,
            "kept": True,
            "prompt_ids": s.prompt_ids,
            "response_ids": s.response_ids,
            "loss_mask": s.loss_mask,
            "response_logprobs": s.response_logprobs,
            "sampling_spans": s.sampling_spans if s.sampling_spans is not None else sampled_at(s.loss_mask, 1.0),
            "reward": s.reward,
            "filter_reason": None,
            "weight_version_min": self.versions[-1] if self.versions else None,
            "weight_version_max": self.versions[-1] if self.versions else None,
            "turn_count": 2,
        }
