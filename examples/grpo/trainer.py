"""GRPO on claimed groups: group-normalised advantages, a clipped importance ratio against the logprobs of the
weights the samples were drawn from, loss only where the loss mask is 1.

The loop trains on-policy (every sample was drawn under the weights the trainer holds before the update), so the
old logprobs are the trainer's own, computed once before the first epoch; the captured ones (what the backend
returned when it sampled) must equal them up to float noise: ``StepStats.max_logprob_gap`` reports how far they
were, a direct check of token faithfulness. The update uses the trainer's own numbers rather than the captured
ones because that float noise is not reproducible (the local engine computes a prompt in one piece or from a
cached prefix, depending on which call came first), and Adam turns a 1e-6 difference into diverging weights
within a few steps; this way an update depends only on the sampled ids and the rewards. The toy samples at
temperature 1, where SGLang-style temperature-scaled logprobs and raw ones agree.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class StepStats:
    mean_reward: float
    loss: float
    groups: int
    trajectories: int
    trained_tokens: int
    max_logprob_gap: float  # |new - captured| logprob before the update, over trained tokens


def advantages(rewards: list[float], eps: float = 1e-6) -> list[float]:
    """(r - mean) / std within a group; all zeros when the group has no spread (nothing to learn from it)."""
    mean = statistics.fmean(rewards)
    std = statistics.pstdev(rewards)
    return [0.0 if std < eps else (r - mean) / (std + eps) for r in rewards]


class GRPOTrainer:
    def __init__(self, model_dir: Path, *, lr: float = 5e-2, clip: float = 0.2, epochs: int = 4, seed: int = 0):
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model.train()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.clip = clip
        self.epochs = epochs

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def step(self, groups: list[dict[str, Any]]) -> StepStats:
        """``epochs`` clipped updates over every trajectory of ``groups`` (as ``PolarClient.claim`` returns them)."""
        samples, rewards_all = [], []
        for group in groups:
            trajectories = group["trajectories"]
            rewards = [float(t["reward"] or 0.0) for t in trajectories]
            rewards_all += rewards
            samples += [
                (t, a)
                for t, a in zip(trajectories, advantages(rewards), strict=True)
                if a != 0.0 and any(t["loss_mask"])
            ]
        tokens = sum(sum(t["loss_mask"]) for t, _ in samples)
        with torch.no_grad():
            olds = [self._logprobs(trajectory) for trajectory, _ in samples]
        gap = max((self._gap(t, old) for (t, _), old in zip(samples, olds, strict=True)), default=0.0)
        losses = []
        for _ in range(self.epochs if samples else 0):
            self.optimizer.zero_grad()
            total = 0.0
            for (trajectory, advantage), old in zip(samples, olds, strict=True):
                loss = self._loss(trajectory, advantage, old)
                (loss / len(samples)).backward()
                total += float(loss.detach()) / len(samples)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            losses.append(total)
        return StepStats(
            mean_reward=statistics.fmean(rewards_all) if rewards_all else 0.0,
            loss=losses[0] if losses else 0.0,
            groups=len(groups),
            trajectories=len(rewards_all),
            trained_tokens=tokens,
            max_logprob_gap=gap,
        )

    def _logprobs(self, trajectory: dict[str, Any]) -> torch.Tensor:
        """The current weights' logprob of each response id."""
        prompt, response = trajectory["prompt_ids"], trajectory["response_ids"]
        logits = self.model(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].float()
        return torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None])[:, 0]

    @staticmethod
    def _gap(trajectory: dict[str, Any], old: torch.Tensor) -> float:
        """The largest gap between the trainer's logprob of a trained token and the captured one."""
        mask = torch.tensor(trajectory["loss_mask"], dtype=torch.float32)
        captured = torch.tensor(trajectory["response_logprobs"], dtype=torch.float32)
        return float(((old - captured).abs() * mask).max())

    def _loss(self, trajectory: dict[str, Any], advantage: float, old: torch.Tensor) -> torch.Tensor:
        """The clipped surrogate loss of one trajectory (mean over its trained tokens)."""
        mask = torch.tensor(trajectory["loss_mask"], dtype=torch.float32)
        ratio = torch.exp(self._logprobs(trajectory) - old)
        clipped = torch.clamp(ratio, 1 - self.clip, 1 + self.clip)
        per_token = -torch.minimum(ratio * advantage, clipped * advantage)
        return (per_token * mask).sum() / mask.sum()
