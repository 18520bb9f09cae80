"""TRL's ``GRPOTrainer`` on Polar rollouts: a ``rollout_func`` and the reward function that reads its rewards.

    from polar.client import PolarClient
    from polar.integrations.trl import PolarRolloutFunc, polar_reward

    rollout = PolarRolloutFunc(PolarClient(url), tokenizer, task=my_task)   # refuses a mismatched tokenizer
    trainer = GRPOTrainer(model, reward_funcs=polar_reward, args=config, train_dataset=prompts,
                          processing_class=tokenizer, rollout_func=rollout)

TRL (1.16) calls ``rollout_func(prompts, trainer)`` with its per-process slice of dataset prompts, each prompt
repeated ``num_generations`` times in a row (its ``RepeatSampler``), and expects one completion per entry:
``prompt_ids``, ``completion_ids`` and ``logprobs``, plus ``env_mask`` (1 on tokens the model sampled, 0 on tokens
the environment inserted: TRL's loss mask) and any other list, which it forwards to the reward functions.

Per call: if the trainer's weights changed since the last publish (a new ``global_step``), they are published
through the control API's weight path (``POST /v1/weights``: every gateway's backend reloads them) as version
``<run>-step-<global_step>``; each run of ``num_generations`` equal prompts becomes one Polar task of that many
samples, built by ``task(prompt)`` and tagged ``metadata.step`` = the published version's ordinal (what admission
control reads), ``trl_step`` and ``weight_version``; the call waits for the tasks and returns their merged
trajectories (``polar.integrations.groups``). Rewards travel as the forwarded field ``polar_reward``. With
``extras=True`` (tasks with ``capture: {top_logprobs: k, routed_experts: true}``) the call also returns
``polar_top_ids``, ``polar_top_logprobs`` and ``polar_routed_experts`` (``polar.integrations.extras``).

Behaviour logprobs: ``logprobs`` are the stored ``response_logprobs`` of each trajectory (what the backend returned
when it sampled; 0.0 on inserted tokens, which ``env_mask`` excludes), one per ``completion_ids`` entry. TRL keeps
them as ``sampling_per_token_logps``, but applies its truncated importance sampling
(``vllm_importance_sampling_correction``: a weight ``exp(old_per_token_logps - sampling_per_token_logps)``,
clipped or masked by ``vllm_importance_sampling_mode`` / ``_clip_max``, on every loss token) only when
``use_vllm`` is set, i.e. when TRL's own vLLM generates. ``enable_importance_sampling(trainer)`` turns that same
code on for Polar's rollouts: the weights are then computed from the captured logprobs.

Mixed sampling regimes: every sample's ``sampling_spans`` (the temperature, top_p, top_k, min_p and logprob
semantics of each span of its response, greedy flagged) travel as ``polar_sampling_spans``. Without
``enable_importance_sampling`` TRL never reads the stored logprobs, so nothing more is done. With it, the loss
tokens whose stored logprob cannot be the trainer's ``log_softmax(logits / temperature)`` at its own top_p/top_k/
min_p (greedy, another temperature or truncation, raw logprobs at T != 1, no regime recorded) are masked
(``polar.integrations.sampling``), ``polar_sampling_masked`` says how many and why, and a sample left with none
is masked whole.

Failures (documented choice): a sample that cannot train (its rollout failed, or it was drawn more than
``max_staleness`` versions behind) is masked: ``env_mask`` all 0 and reward ``None``, which TRL treats as
unscorable (left out of the group's baseline, advantage 0). A group in which no sample can train (all ERROR)
raises ``GroupFailed``: TRL never gets tensors for it. Single-process trainers only (one process publishes).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar.client import PolarClient
from polar.errors import GroupFailed, InvalidRequest
from polar.integrations.extras import sample_extras, trl_fields
from polar.integrations.groups import HasVocab, Sample, check_tokenizer, fetch_group, prompt_text, version_ordinals
from polar.integrations.sampling import TrainerSampling, mask_mismatched
from polar.tokens.tokenizer import vocab_fingerprint

TaskFactory = Callable[[Any], Mapping[str, Any]]


@dataclass(frozen=True)
class RolloutRecord:
    """What one ``rollout_func`` call did (``PolarRolloutFunc.records``)."""

    global_step: int
    version: str  # the weights published for (and tagged on) this call's rollouts
    task_ids: list[str]
    samples: list[Sample]

    @property
    def mean_reward(self) -> float:
        rewards = [s.reward for s in self.samples if s.reward is not None]
        return sum(rewards) / len(rewards) if rewards else 0.0


def template_task(template: Mapping[str, Any]) -> TaskFactory:
    """A task factory: ``template`` (a TaskRequest without ``instruction``) with the prompt as its instruction."""
    return lambda prompt: {**template, "instruction": prompt_text(prompt)}


class PolarRolloutFunc:
    """``GRPOTrainer(rollout_func=PolarRolloutFunc(...))``; see the module docstring for the contract.

    ``task`` maps a dataset prompt to a TaskRequest dict (instruction, harness, runtime, evaluator, builder;
    ``num_samples`` is set here), or is a template mapping used via ``template_task``. ``checkpoint_dir``: publish
    ``save_pretrained`` folders there (for SGLang / vLLM backends, which load from disk); without it the weights
    are uploaded as tensors (the in-process local backend)."""

    def __init__(
        self,
        client: PolarClient,
        tokenizer: HasVocab,
        task: TaskFactory | Mapping[str, Any],
        *,
        run_name: str | None = None,
        max_staleness: int | None = 0,
        checkpoint_dir: Path | None = None,
        timeout_s: float = 3600.0,
        poll_s: float = 0.5,
        log: Callable[[str], None] | None = None,
        extras: bool = False,
    ):
        self.served = check_tokenizer(client, tokenizer)
        self.client = client
        self.task = template_task(task) if isinstance(task, Mapping) else task
        self.run_name = run_name or f"trl-{uuid.uuid4().hex[:8]}"
        self.max_staleness = max_staleness
        self.checkpoint_dir = checkpoint_dir
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.log = log
        self.extras = extras  # also return top-k logprobs and routed experts (polar.integrations.extras)
        self.records: list[RolloutRecord] = []
        self._published: tuple[int, str] | None = None  # (global_step, version)
        self._checked: Any = None
        self.__name__ = "polar_rollout"

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        if trainer.accelerator.num_processes != 1:
            raise InvalidRequest("PolarRolloutFunc supports one trainer process (it publishes the weights)")
        if self._checked is not trainer.processing_class:  # the trainer's own tokenizer, once
            if vocab_fingerprint(trainer.processing_class.get_vocab()) != self.served["tokenizer"]["fingerprint"]:
                check_tokenizer(self.client, trainer.processing_class)  # raises TokenizerMismatch with the details
            self._checked = trainer.processing_class
        n = trainer.num_generations if trainer.model.training else trainer.num_generations_eval
        if not prompts or len(prompts) % n:
            raise InvalidRequest(f"got {len(prompts)} prompts, not a multiple of num_generations={n}", field="prompts")
        chunks = [prompts[i : i + n] for i in range(0, len(prompts), n)]
        if any(any(p != chunk[0] for p in chunk) for chunk in chunks):
            raise InvalidRequest(f"prompts must come in runs of {n} equal ones (TRL's RepeatSampler)", field="prompts")
        step = int(trainer.state.global_step)
        version, ordinal = self.publish(trainer, step)
        tasks = [self._task(chunk[0], n, step, version, ordinal) for chunk in chunks]
        task_ids = self.client.submit(tasks)
        views = {v["task_id"]: v for v in self.client.wait(task_ids, timeout_s=self.timeout_s, poll_s=self.poll_s)}
        ordinals = version_ordinals(self.client)
        pad = _pad_id(trainer)
        assumed = _weighs_stored_logprobs(trainer)
        samples = []
        for task_id in task_ids:
            group = fetch_group(
                self.client,
                views[task_id],
                ordinals=ordinals,
                max_staleness=self.max_staleness,
                fallback_prompt_ids=[pad],  # a rollout without trajectory: one masked pad token each side
                pad_id=pad,
            )
            if assumed is not None:
                group = _masked_group(views[task_id], [mask_mismatched(s, assumed) for s in group])
            samples += group
        record = RolloutRecord(step, version, task_ids, samples)
        self.records.append(record)
        if self.log is not None:
            masked = sum(not s.trainable for s in samples)
            self.log(
                f"step {step:3d}  {version}  mean reward {record.mean_reward:.3f}  "
                f"({len(samples)} samples, {masked} masked, {sum(map(sum, (s.loss_mask for s in samples)))} tokens)"
            )
        fields: dict[str, list[Any]] = {}
        if self.extras:
            fields = trl_fields(samples, sample_extras(self.client, samples))
        return fields | {
            "prompt_ids": [s.prompt_ids for s in samples],
            "completion_ids": [s.completion_ids for s in samples],
            "logprobs": [s.logprobs for s in samples],
            "env_mask": [s.loss_mask for s in samples],
            "polar_reward": [s.reward for s in samples],
            "polar_rollout_id": [s.rollout_id for s in samples],
            "polar_weight_version": [s.weight_version_max for s in samples],
            "polar_status": [s.status for s in samples],
            "polar_sampling_spans": [s.sampling_spans for s in samples],
            "polar_sampling_masked": [s.sampling_masked for s in samples],
        }

    def publish(self, trainer: Any, step: int) -> tuple[str, int]:
        """Publish the trainer's weights as ``<run>-step-<step>`` unless that step is already published."""
        if self._published is None or self._published[0] != step:
            version = f"{self.run_name}-step-{step}"
            model = trainer.accelerator.unwrap_model(trainer.model)
            if self.checkpoint_dir is not None:
                path = self.checkpoint_dir / version
                model.save_pretrained(path)
                self.client.register_weights(version, checkpoint_path=str(path), notes=f"TRL global_step {step}")
            else:
                self.client.register_weights(version, state_dict=model.state_dict(), notes=f"TRL global_step {step}")
            self._published = (step, version)
        version = self._published[1]
        return version, version_ordinals(self.client)[version]

    def _task(self, prompt: Any, n: int, step: int, version: str, ordinal: int) -> dict[str, Any]:
        task = dict(self.task(prompt))
        metadata = dict(task.get("metadata") or {})
        metadata.update(step=ordinal, trl_step=step, trl_run=self.run_name, weight_version=version)
        return {**task, "num_samples": n, "metadata": metadata}


class _PolarPublishes:
    """Stands in for TRL's vLLM generation object once ``enable_importance_sampling`` is on: TRL asks it to sync
    the weights before each ``rollout_func`` call of a new step, and Polar's rollout_func publishes them itself."""

    def sync_weights(self) -> None:
        return None


def enable_importance_sampling(trainer: Any) -> Any:
    """Make TRL's ``GRPOTrainer`` apply its truncated importance sampling to Polar's rollouts; returns ``trainer``.

    TRL 1.16 computes the correction (``importance_sampling_ratio``, from ``old_per_token_logps`` - its recompute
    before the update - and ``sampling_per_token_logps`` - the ``logprobs`` the rollout_func returned, here the
    captured behaviour logprobs) and multiplies it into the loss only under ``use_vllm``. This sets ``use_vllm`` on
    the built trainer with a stand-in generation object whose weight sync does nothing (``PolarRolloutFunc``
    publishes the weights), so every other part of TRL's correction runs as written: the mode and bounds come from
    ``GRPOConfig`` (``vllm_importance_sampling_mode``, ``vllm_importance_sampling_clip_max`` / ``_clip_min``), and
    the ``sampling/importance_sampling_ratio/*`` and ``sampling/sampling_logp_difference/*`` metrics are logged.

    Call it after constructing the trainer and before ``train()``. Refuses (``InvalidRequest``) a trainer whose
    ``rollout_func`` is not a ``PolarRolloutFunc``, one whose own vLLM generates (``use_vllm`` already set: its
    correction is already on), one built with ``vllm_importance_sampling_correction=False``, one with ``tools``
    (TRL's tool loop would run on Polar's finished rollouts), and VESPO with a sequence-level mode (TRL's own rule).
    The weights are right only for tokens sampled at the trainer's ``temperature`` (and top_p/top_k/min_p) whose
    logprobs mean ``log_softmax(logits / T)`` (SGLang, the local engine; vLLM's raw logprobs only at T = 1): from
    then on ``PolarRolloutFunc`` masks every other loss token by its stored sampling span (see the module
    docstring and docs/trainers.md)."""
    if not isinstance(getattr(trainer, "rollout_func", None), PolarRolloutFunc):
        raise InvalidRequest("enable_importance_sampling needs a GRPOTrainer built with a PolarRolloutFunc")
    if trainer.use_vllm and not isinstance(getattr(trainer, "vllm_generation", None), _PolarPublishes):
        raise InvalidRequest("this trainer generates with its own vLLM (use_vllm): TRL's correction is already on")
    if not trainer.vllm_importance_sampling_correction:
        raise InvalidRequest(
            "the trainer was built with vllm_importance_sampling_correction=False", field="importance_sampling"
        )
    if getattr(trainer, "tools", None):
        raise InvalidRequest("a trainer with tools runs TRL's tool loop; Polar's harnesses run the tools")
    if trainer.loss_type == "vespo" and trainer.vllm_importance_sampling_mode not in ("token_truncate", "token_mask"):
        raise InvalidRequest("VESPO needs vllm_importance_sampling_mode 'token_truncate' or 'token_mask'")
    trainer.use_vllm = True
    trainer.vllm_generation = _PolarPublishes()
    trainer._last_loaded_step = -1
    return trainer


def _weighs_stored_logprobs(trainer: Any) -> TrainerSampling | None:
    """What the trainer's importance ratio assumes of the stored logprobs, once ``enable_importance_sampling`` made
    it weigh them (its recompute divides the logits by its ``temperature``); None while it does not."""
    if not (trainer.use_vllm and isinstance(getattr(trainer, "vllm_generation", None), _PolarPublishes)):
        return None
    return TrainerSampling.of(
        trainer.temperature, getattr(trainer, "top_p", None), getattr(trainer, "top_k", None), trainer.min_p
    )


def _masked_group(task: Mapping[str, Any], group: list[Sample]) -> list[Sample]:
    """``group`` unless sampling masks left none of it trainable: then ``GroupFailed``, as for any such group."""
    if any(s.trainable for s in group):
        return group
    reasons = "; ".join(f"sample {s.sample_index}: {s.masked_reason}" for s in group[:8] if s.masked_reason)
    raise GroupFailed(
        f"task {task['task_id']}: none of its {len(group)} samples can train ({reasons})", field="task_id"
    )


def polar_reward(prompts: list[Any], completions: list[Any], polar_reward: list[float | None], **_: Any) -> list[Any]:
    """TRL reward function: the evaluator's reward of each rollout (``None`` for a masked sample)."""
    if len(polar_reward) != len(completions):
        raise InvalidRequest("polar_reward does not have one reward per completion", field="polar_reward")
    return list(polar_reward)


def _pad_id(trainer: Any) -> int:
    tokenizer = trainer.processing_class
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return int(pad or 0)
