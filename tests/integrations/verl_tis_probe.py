"""verl 0.9.1's rollout correction on ``PolarAgentLoop`` outputs, in a process with verl on its path.

    PYTHONPATH=.verl-site:. python -m tests.integrations.verl_tis_probe MODEL_DIR STORED_JSON MODE

Instantiates the loop as verl's ``AgentLoopWorker`` does (``hydra.utils.instantiate``, verl's config wrappers) with
the control API replaced by ``tests.integrations.behaviour.FakeControlAPI`` over the stored trajectories, runs one
sample per trajectory, and turns each ``AgentLoopOutput`` into verl's tensors the way verl does (``as_dict``, then
``rollout_log_probs`` right-padded with 0.0 to ``response_length`` as ``_agent_loop_postprocess`` pads it). With
``old_log_probs`` set to the trainer's recompute, verl's ``compute_rollout_correction_and_add_to_batch`` (what
its ray trainer calls with ``algorithm.rollout_correction``) gives ``rollout_is_weights``; printed as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

RESPONSE_LENGTH = 24


def main(model_dir: str, stored_json: str, mode: str) -> dict[str, Any]:
    import hydra
    import torch
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.protocol import DataProto
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

    import polar.integrations.verl as adapter
    from polar.tokens.tokenizer import vocab_fingerprint
    from tests.integrations.behaviour import CAP, FakeControlAPI, load

    stored = load(Path(stored_json))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    api = FakeControlAPI(stored, vocab_fingerprint(tokenizer.get_vocab()))
    adapter.PolarClient = lambda url, token=None: api  # type: ignore[assignment,misc]  # the loop's client
    config = OmegaConf.create(
        {"actor_rollout_ref": {"rollout": {"prompt_length": 64, "response_length": RESPONSE_LENGTH}}, "data": {}}
    )
    target = {"_target_": "polar.integrations.verl.PolarAgentLoop", "polar_url": "http://fake", "task": {"x": 1}}
    loop = hydra.utils.instantiate(
        config=target,
        trainer_config=DictConfigWrap(config=config),
        server_manager=None,
        tokenizer=tokenizer,
        processor=None,
        hf_model_type="qwen3",
        dataset_cls=None,
        data_config=DictConfigWrap(config.data),
        tools=ToolListWrap([]),
    )
    rows: dict[str, list[torch.Tensor]] = {"rollout_log_probs": [], "response_mask": [], "old_log_probs": []}
    for s in stored:
        output = asyncio.run(loop.run({"temperature": 1.0}, raw_prompt=[{"role": "user", "content": "p"}]))
        tensors = output.as_dict()
        pad = RESPONSE_LENGTH - len(output.response_ids)
        # verl's _agent_loop_postprocess: response_logprobs + [0.0] * pad; the mask padded with 0.
        rows["rollout_log_probs"].append(torch.tensor(output.response_logprobs + [0.0] * pad))
        assert torch.equal(tensors["rollout_log_probs"], rows["rollout_log_probs"][-1][: len(output.response_ids)])
        rows["response_mask"].append(torch.cat([tensors["response_mask"], torch.zeros(pad, dtype=torch.int64)]))
        rows["old_log_probs"].append(torch.tensor(s.recompute + [0.0] * pad))  # the trainer's recompute
    batch = DataProto.from_dict(tensors={k: torch.stack(v) for k, v in rows.items()})
    corr = RolloutCorrectionConfig(rollout_is=mode, rollout_is_threshold=CAP)
    batch, metrics = compute_rollout_correction_and_add_to_batch(batch, corr)
    return {
        "rollout_log_probs": batch.batch["rollout_log_probs"].tolist(),
        "response_mask": batch.batch["response_mask"].tolist(),
        "rollout_is_weights": batch.batch["rollout_is_weights"].tolist(),
        "metrics": {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))},
    }


if __name__ == "__main__":
    print("PROBE " + json.dumps(main(*sys.argv[1:4])))
