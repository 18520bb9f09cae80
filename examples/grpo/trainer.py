"""GRPO on claimed groups: group-normalised advantages, a clipped importance ratio against the logprobs of the
weights the samples were drawn from, loss only where the loss mask is 1.

The loop trains on-policy (every sample was drawn under the weights the trainer holds before the update), so the
old logprobs are the trainer's own, taken from the first epoch's forward pass before any update; the captured
ones (what the backend returned when it sampled) must equal them up to float noise: ``StepStats.
max_logprob_gap`` reports how far they were, a direct check of token faithfulness. The update uses the trainer's
own numbers rather than the captured ones because that float noise is not reproducible (the local engine
computes a prompt in one piece or from a cached prefix, depending on which call came first), and Adam turns a
1e-6 difference into diverging weights within a few steps; this way an update depends only on the sampled ids
and the rewards. Logprobs are taken at the sampling ``temperature`` (logits / T), as the engine reports them
(SGLang's temperature-scaled semantics), so the gap check holds at any temperature.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class StepStats:
    mean_reward: float
    solve_rate: float  # the share of samples whose reward is 1 (solved outright)
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


def micro_batches(trajectories: list[dict[str, Any]], budget: int) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """(index of the first, trajectories) in order, each batch at most ``budget`` padded tokens (at least one)."""
    start, batch, width = 0, [], 0
    for index, trajectory in enumerate(trajectories):
        length = len(trajectory["prompt_ids"]) + len(trajectory["response_ids"])
        if batch and max(width, length) * (len(batch) + 1) > budget:
            yield start, batch
            start, batch, width = index, [], 0
        batch.append(trajectory)
        width = max(width, length)
    if batch:
        yield start, batch


class GRPOTrainer:
    def __init__(
        self,
        model_dir: Path,
        *,
        lr: float = 5e-2,
        clip: float = 0.2,
        epochs: int = 4,
        seed: int = 0,
        temperature: float = 1.0,
        batch_tokens: int = 4096,
    ):
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model.train()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.clip = clip
        self.epochs = epochs
        self.temperature = temperature
        self.batch_tokens = batch_tokens  # padded tokens per forward pass

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def save(self, folder: Path) -> None:
        """The weights as ``folder/model.safetensors`` (every key of the state dict, tied ones included)."""
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        save_file(self.state_dict(), folder / "model.safetensors")

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
        olds: list[torch.Tensor] = []  # filled by the first epoch's forward passes, before any update
        losses = []
        for _ in range(self.epochs if samples else 0):
            self.optimizer.zero_grad()
            total = 0.0
            for start, chunk in micro_batches([t for t, _ in samples], self.batch_tokens):
                currents = self._logprobs(chunk)
                if len(olds) == start:
                    olds += [c.detach() for c in currents]
                loss = sum(
                    self._loss(t, samples[start + i][1], current, olds[start + i])
                    for i, (t, current) in enumerate(zip(chunk, currents, strict=True))
                )
                (loss / len(samples)).backward()
                total += float(loss.detach()) / len(samples)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            losses.append(total)
        gap = max((self._gap(t, old) for (t, _), old in zip(samples, olds, strict=True)), default=0.0)
        return StepStats(
            mean_reward=statistics.fmean(rewards_all) if rewards_all else 0.0,
            solve_rate=sum(r >= 1.0 for r in rewards_all) / len(rewards_all) if rewards_all else 0.0,
            loss=losses[0] if losses else 0.0,
            groups=len(groups),
            trajectories=len(rewards_all),
            trained_tokens=tokens,
            max_logprob_gap=gap,
        )

    def _logprobs(self, trajectories: list[dict[str, Any]]) -> list[torch.Tensor]:
        """The current weights' logprob of each response id, per trajectory, from one right-padded forward pass
        (causal attention: padding after a row changes nothing before it)."""
        rows = [t["prompt_ids"] + t["response_ids"] for t in trajectories]
        width = max(map(len, rows))
        ids = torch.tensor([row + [0] * (width - len(row)) for row in rows])
        attention = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
        logits = self.model(input_ids=ids, attention_mask=attention).logits
        out = []
        for row, trajectory in enumerate(trajectories):
            start, response = len(trajectory["prompt_ids"]) - 1, trajectory["response_ids"]
            scaled = logits[row, start : start + len(response)].float() / self.temperature
            out.append(torch.log_softmax(scaled, -1).gather(1, torch.tensor(response)[:, None])[:, 0])
        return out

    @staticmethod
    def _gap(trajectory: dict[str, Any], old: torch.Tensor) -> float:
        """The largest gap between the trainer's logprob of a trained token and the captured one."""
        mask = torch.tensor(trajectory["loss_mask"], dtype=torch.float32)
        captured = torch.tensor(trajectory["response_logprobs"], dtype=torch.float32)
        return float(((old - captured).abs() * mask).max())

    def _loss(
        self, trajectory: dict[str, Any], advantage: float, current: torch.Tensor, old: torch.Tensor
    ) -> torch.Tensor:
        """The clipped surrogate loss of one trajectory (mean over its trained tokens)."""
        mask = torch.tensor(trajectory["loss_mask"], dtype=torch.float32)
        ratio = torch.exp(current - old)
        clipped = torch.clamp(ratio, 1 - self.clip, 1 + self.clip)
        per_token = -torch.minimum(ratio * advantage, clipped * advantage)
        return (per_token * mask).sum() / mask.sum()
