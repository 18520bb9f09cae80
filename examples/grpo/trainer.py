"""GRPO on claimed groups: group-normalised advantages, a clipped importance ratio against the captured
(behaviour) logprobs, loss only where the loss mask is 1.

The behaviour logprobs are the ones the backend returned when it sampled (the captures), so before the first
update the ratio must be 1 up to float noise: ``StepStats.max_logprob_gap`` reports how far it was, a direct
check of token faithfulness. The toy samples at temperature 1, where SGLang-style temperature-scaled logprobs
and raw ones agree.
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
        losses, gap, tokens = [], 0.0, sum(sum(t["loss_mask"]) for t, _ in samples)
        for epoch in range(self.epochs if samples else 0):
            self.optimizer.zero_grad()
            total = 0.0
            for trajectory, advantage in samples:
                loss, sample_gap = self._loss(trajectory, advantage)
                (loss / len(samples)).backward()
                total += float(loss.detach()) / len(samples)
                if epoch == 0:
                    gap = max(gap, sample_gap)
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

    def _loss(self, trajectory: dict[str, Any], advantage: float) -> tuple[torch.Tensor, float]:
        """The clipped surrogate loss of one trajectory (mean over its trained tokens), and the largest gap between
        the current and the captured logprob of a trained token."""
        prompt, response = trajectory["prompt_ids"], trajectory["response_ids"]
        mask = torch.tensor(trajectory["loss_mask"], dtype=torch.float32)
        logits = self.model(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].float()
        new = torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None])[:, 0]
        old = torch.tensor(trajectory["response_logprobs"], dtype=torch.float32)
        ratio = torch.exp(new - old)
        clipped = torch.clamp(ratio, 1 - self.clip, 1 + self.clip)
        per_token = -torch.minimum(ratio * advantage, clipped * advantage)
        gap = float(((new.detach() - old).abs() * mask).max())
        return (per_token * mask).sum() / mask.sum(), gap
