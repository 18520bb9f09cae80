"""A verl agent loop whose samples are Polar rollouts (verl 0.9.1, ``verl.experimental.agent_loop``).

verl calls ``AgentLoopBase.run(sampling_params, **row)`` once per sample (``rollout.n`` times per prompt) with
the dataset row's fields (``raw_prompt``, ``extra_info``, ...). ``PolarAgentLoop.run`` submits that sample as a
one-sample Polar task through the control API, waits for it, and returns verl's ``AgentLoopOutput``: the merged
trajectory's ``prompt_ids``, ``response_ids``, ``response_mask`` (1 on sampled tokens, 0 on inserted ones),
``response_logprobs`` (as captured), ``reward_score`` (the evaluator's), ``num_turns`` and ``metrics``, with the
rollout's id, status and weight versions in ``extra_fields``. The captured logprobs are the behaviour policy's:
verl's ``as_dict`` makes them ``rollout_log_probs``, which its rollout correction
(``algorithm.rollout_correction.rollout_is`` / ``rollout_is_threshold``: truncated importance sampling) or bypass
mode reads; 0.0 on inserted tokens, where ``response_mask`` is 0. With ``extras: true`` (tasks capturing them) the
trajectory's routed experts go into ``AgentLoopOutput.routed_experts`` where this verl has the field, and its top-k
logprobs into ``extra_fields`` (``polar_top_ids``, ``polar_top_logprobs``, ``polar_top_mask``).

The task: ``extra_info["polar_task"]`` (a TaskRequest dict) when the row has one, else the ``task`` template
given in the agent-loop config with the last user message of ``raw_prompt`` as its instruction. Register it in
verl's agent-loop config file (``actor_rollout_ref.rollout.agent.agent_loop_config_path``)::

    - name: polar
      _target_: polar.integrations.verl.PolarAgentLoop
      polar_url: http://polar-api:8800
      task: {harness: {name: codex, model: policy}, evaluator: {type: tests, config: {...}}}

verl owns the weights here: its rollout servers are the backend of Polar's gateway (``POLAR_BACKEND=sglang``,
``POLAR_BACKEND_URL`` = verl's server) and verl syncs them itself; captures carry the version the server reports.

Mixed sampling regimes: the trajectory's ``sampling_spans`` (temperature, top_p, top_k, min_p and logprob semantics
per span of the response, greedy flagged) go into ``extra_fields["polar_sampling_spans"]``. Where verl weighs the
stored logprobs (``algorithm.rollout_correction``: ``rollout_is``, ``rollout_rs`` or ``bypass_mode``; or
``mask_sampling_mismatch: true`` in the agent-loop config), the loss tokens whose logprob cannot be
``log_softmax(logits / T)`` at the rollout's own ``sampling_params`` (greedy, another temperature or truncation, raw
logprobs at T != 1, no regime recorded) get ``response_mask`` 0 (``polar.integrations.sampling``), and
``polar_sampling_masked`` says how many and why; a sample left with none is masked as below.

A sample whose rollout cannot train (ERROR, deadline TIMEOUT, no trajectory) is returned masked:
``response_mask`` all 0, ``reward_score`` 0.0, ``extra_fields["polar_masked_reason"]`` set. A response longer
than ``rollout.response_length`` is cut there (as verl's own loops do) and flagged ``polar_truncated``; a prompt
longer than ``rollout.prompt_length`` raises. A tokenizer other than the one Polar serves refuses to start.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

from polar.client import PolarClient
from polar.errors import InvalidRequest
from polar.integrations.extras import sample_extras
from polar.integrations.groups import Sample, check_tokenizer, fetch_group, prompt_text
from polar.integrations.sampling import TrainerSampling, mask_mismatched


class PolarAgentLoop(AgentLoopBase):  # type: ignore[misc]  # verl ships no types
    def __init__(
        self,
        *args: Any,
        polar_url: str,
        polar_token: str | None = None,  # None: POLAR_CONTROL_TOKEN or the token file in POLAR_HOME
        task: Mapping[str, Any] | None = None,
        timeout_s: float = 3600.0,
        poll_s: float = 0.5,
        extras: bool = False,
        mask_sampling_mismatch: bool | None = None,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.client = PolarClient(polar_url, token=polar_token)
        check_tokenizer(self.client, self.tokenizer)
        self.template = _plain(task or {})
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.extras = extras  # routed experts (and top-k) of the trajectory, for tasks that capture them
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)
        # Mask loss tokens sampled unlike verl's rollout settings (polar.integrations.sampling); None: exactly when
        # verl weighs the stored logprobs (its rollout correction or bypass mode is on).
        self.mask_sampling_mismatch = (
            _weighs_rollout_logprobs(getattr(self, "config", None))
            if mask_sampling_mismatch is None
            else mask_sampling_mismatch
        )

    def task_for(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """The one-sample TaskRequest for a verl dataset row."""
        extra = row.get("extra_info") or {}
        if isinstance(extra, Mapping) and isinstance(extra.get("polar_task"), Mapping):
            task = _plain(extra["polar_task"])
        elif self.template:
            task = {**self.template, "instruction": prompt_text(list(row["raw_prompt"]))}
        else:
            raise InvalidRequest("the row has no extra_info.polar_task and the agent loop no task", field="task")
        return {**task, "num_samples": 1}

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        started = time.monotonic()
        sample, turns = await asyncio.to_thread(self._rollout, self.task_for(kwargs))
        if self.mask_sampling_mismatch:
            settings = _plain(sampling_params)
            assumed = TrainerSampling.of(
                settings.get("temperature", 1.0), settings.get("top_p"), settings.get("top_k"), settings.get("min_p")
            )
            sample = mask_mismatched(sample, assumed)
        if len(sample.prompt_ids) > self.prompt_length:
            raise InvalidRequest(
                f"rollout {sample.rollout_id}: prompt of {len(sample.prompt_ids)} tokens is longer than "
                f"rollout.prompt_length={self.prompt_length}",
                field="prompt_length",
            )
        cut = self.response_length
        fields = await asyncio.to_thread(self._extras, sample, cut) if self.extras else {}
        extra = fields.pop("extra_fields", {})
        return AgentLoopOutput(
            **fields,
            prompt_ids=sample.prompt_ids,
            response_ids=sample.completion_ids[:cut],
            response_mask=sample.loss_mask[:cut],
            response_logprobs=sample.logprobs[:cut],
            reward_score=sample.reward if sample.reward is not None else 0.0,
            num_turns=turns,
            metrics=AgentLoopMetrics(generate_sequences=time.monotonic() - started),
            extra_fields={
                "polar_rollout_id": sample.rollout_id,
                "polar_status": sample.status,
                "polar_weight_version_min": sample.weight_version_min,
                "polar_weight_version_max": sample.weight_version_max,
                "polar_masked_reason": sample.masked_reason,
                "polar_truncated": len(sample.completion_ids) > cut,
                "polar_sampling_spans": sample.sampling_spans,
                "polar_sampling_masked": sample.sampling_masked,
                **extra,
            },
        )

    def _extras(self, sample: Sample, cut: int) -> dict[str, Any]:
        """``routed_experts`` ((prompt + response) x layers x k, cut like the response) where this verl's
        ``AgentLoopOutput`` has the field, and the top-k under ``extra_fields``."""
        (extras,) = sample_extras(self.client, [sample])
        if extras is None:
            return {}
        out: dict[str, Any] = {"extra_fields": {}}
        if extras.routed_experts is not None and "routed_experts" in AgentLoopOutput.model_fields:
            out["routed_experts"] = extras.routed_experts[: len(sample.prompt_ids) + cut]
        if extras.top_ids is not None and extras.top_logprobs is not None and extras.top_mask is not None:
            out["extra_fields"] = {
                "polar_top_ids": extras.top_ids[:cut],
                "polar_top_logprobs": extras.top_logprobs[:cut],
                "polar_top_mask": extras.top_mask[:cut],
            }
        return out

    def _rollout(self, task: dict[str, Any]) -> tuple[Sample, int]:
        (task_id,) = self.client.submit([task])
        (view,) = self.client.wait([task_id], timeout_s=self.timeout_s, poll_s=self.poll_s)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        (sample,) = fetch_group(
            self.client,
            view,
            ordinals={},
            fallback_prompt_ids=[int(pad or 0)],
            pad_id=int(pad or 0),
            require_trainable=False,
        )
        turns = 0
        if sample.chains:
            rows = self.client.trajectories(rollout_id=sample.rollout_id, builder=view["builder"])
            turns = max((int(r["turn_count"] or 0) for r in rows), default=0)
        return sample, turns


def _weighs_rollout_logprobs(config: Any) -> bool:
    """Whether verl's ``algorithm.rollout_correction`` reads ``rollout_log_probs`` as the behaviour policy's:
    importance sampling or rejection sampling on (``rollout_is`` / ``rollout_rs``), or ``bypass_mode``."""
    correction = _field(_field(config, "algorithm"), "rollout_correction")
    return any(bool(_field(correction, name)) for name in ("rollout_is", "rollout_rs", "bypass_mode"))


def _field(config: Any, name: str) -> Any:
    """``config[name]`` of an OmegaConf node, a dict or a dataclass; None where absent."""
    if config is None:
        return None
    getter = getattr(config, "get", None)
    return getter(name) if callable(getter) else getattr(config, name, None)


def _plain(value: Any) -> Any:
    """Plain dicts and lists (verl hands over OmegaConf containers and numpy arrays from its parquet rows)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ in ("ListConfig", "ndarray"):
        return [_plain(v) for v in value]
    return value
