"""Run ``PolarAgentLoop`` the way verl's ``AgentLoopWorker`` does, in a process with verl on its path.

    PYTHONPATH=.verl-site:. python -m tests.api.verl_probe API_URL MODEL_DIR TASK_JSON

Instantiates the loop with ``hydra.utils.instantiate`` and verl's own config wrappers (as
``AgentLoopWorker._run_agent_loop`` does), runs one sample, converts the output with verl's
``AgentLoopOutput.as_dict`` (the tensors verl's post-processing reads) and prints a JSON summary for the test.
A mismatched tokenizer is tried too and its error printed.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any


def main(url: str, model_dir: str, task_json: str) -> dict[str, Any]:
    import hydra
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, DictConfigWrap, ToolListWrap

    task = json.loads(task_json)
    config = OmegaConf.create(
        {"actor_rollout_ref": {"rollout": {"prompt_length": 256, "response_length": 8}}, "data": {}}
    )
    target = {"_target_": "polar.integrations.verl.PolarAgentLoop", "polar_url": url, "task": task, "poll_s": 0.2}
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def instantiate(tok: Any) -> Any:
        return hydra.utils.instantiate(
            config=target,
            trainer_config=DictConfigWrap(config=config),
            server_manager=None,
            tokenizer=tok,
            processor=None,
            hf_model_type="qwen3",
            dataset_cls=None,
            data_config=DictConfigWrap(config.data),
            tools=ToolListWrap([]),
        )

    loop = instantiate(tokenizer)
    row = {"raw_prompt": [{"role": "user", "content": task["instruction"]}], "extra_info": {}, "index": 0}
    output = asyncio.run(loop.run({"temperature": 1.0}, **row))
    assert isinstance(output, AgentLoopOutput), type(output)
    tensors = output.as_dict()
    other = AutoTokenizer.from_pretrained(model_dir)
    other.add_tokens(["<not-in-polar>"])
    try:
        instantiate(other)
        mismatch = None
    except Exception as exc:  # noqa: BLE001 -- the probe reports whatever verl's instantiate surfaced
        mismatch = f"{type(exc).__name__}: {exc}"
    return {
        "type": f"{type(output).__module__}.{type(output).__name__}",
        "prompt_ids": output.prompt_ids,
        "response_ids": output.response_ids,
        "response_mask": output.response_mask,
        "response_logprobs": output.response_logprobs,
        "reward_score": output.reward_score,
        "num_turns": output.num_turns,
        "generate_sequences_s": output.metrics.generate_sequences,
        "extra_fields": output.extra_fields,
        "as_dict": {
            "prompts": tensors["prompts"].tolist(),
            "responses": tensors["responses"].tolist(),
            "response_mask": tensors["response_mask"].tolist(),
            "rollout_log_probs": tensors["rollout_log_probs"].tolist(),
            "rm_scores": tensors["rm_scores"].tolist(),
        },
        "mismatch": mismatch,
    }


if __name__ == "__main__":
    print("PROBE " + json.dumps(main(*sys.argv[1:4])))
