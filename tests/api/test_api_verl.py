"""``polar.integrations.verl.PolarAgentLoop`` against verl 0.9.1's own classes.

verl's pins conflict with ours (see scripts/verl_env.sh), so verl lives in an overlay folder (``.verl-site``) put
on PYTHONPATH of a child process only: the probe (``tests/api/verl_probe.py``) instantiates the loop as verl's
``AgentLoopWorker`` does, runs one sample through this module's control API, and reports verl's
``AgentLoopOutput`` and its ``as_dict`` tensors, which are checked here against the stored trajectory.
Without the overlay the test skips (under ``CI=true`` that is a failure: ``make tools`` builds it).
"""

from __future__ import annotations

import json

import pytest

from examples.grpo.toy import toy_task
from polar.client import PolarClient
from tests.api.retry_task import check_kept_chain, retry_task
from tests.verl import run_probe


def probe(api, tiny_model_dir, verl_site, task) -> dict:
    """verl's ``AgentLoopOutput`` of one sample of ``task``, as the probe reports it."""
    return run_probe(verl_site, "tests.api.verl_probe", api.url, str(tiny_model_dir), json.dumps(task))


def test_polar_agent_loop_returns_verls_agent_loop_output(api, tiny_model_dir, verl_site):
    task = {**toy_task(step=0, group=0, samples=1), "instruction": "Write a few words using only a to m."}
    task["metadata"] = {"toy": "first-half"}  # no admission step: verl, not the feed, owns the weights here
    out = probe(api, tiny_model_dir, verl_site, task)
    assert out["type"] == "verl.experimental.agent_loop.agent_loop.AgentLoopOutput"

    extra = out["extra_fields"]
    with PolarClient(api.url) as client:
        (stored,) = client.trajectories(rollout_id=extra["polar_rollout_id"], builder="prefix_merge", tokens=True)
        rollout = client.rollout(extra["polar_rollout_id"])
    assert extra["polar_status"] == rollout["status"] == "COMPLETED" and extra["polar_masked_reason"] is None
    # response_length is 8 in the probe's config and the toy samples 12 tokens: cut there, and flagged.
    assert len(stored["response_ids"]) == 12 and extra["polar_truncated"] is True
    assert out["prompt_ids"] == stored["prompt_ids"]
    assert out["response_ids"] == stored["response_ids"][:8]
    assert out["response_mask"] == stored["loss_mask"][:8] == [1] * 8
    assert out["response_logprobs"] == pytest.approx(stored["response_logprobs"][:8], abs=1e-6)
    assert out["reward_score"] == pytest.approx(rollout["reward"]) and out["num_turns"] == 1
    # verl's own conversion to the tensors its post-processing reads: the reward on the last response token.
    tensors = out["as_dict"]
    assert tensors["prompts"] == out["prompt_ids"] and tensors["responses"] == out["response_ids"]
    assert tensors["response_mask"] == out["response_mask"]
    assert tensors["rollout_log_probs"] == pytest.approx(out["response_logprobs"], abs=1e-6)
    assert tensors["rm_scores"][:-1] == [0.0] * 7 and tensors["rm_scores"][-1] == pytest.approx(rollout["reward"])
    # A tokenizer other than Polar's refuses to start, through verl's instantiate.
    assert out["mismatch"] is not None and "TokenizerMismatch" in out["mismatch"]


def test_polar_agent_loop_trains_the_chain_the_harness_kept_after_a_final_call_retry(api, tiny_model_dir, verl_site):
    """The rollout retried its last call after cutting its stream: verl's output is the kept chain (cut at its
    response length), and the abandoned copy trains nowhere."""
    out = probe(api, tiny_model_dir, verl_site, retry_task("Write a few words using only a to m."))
    extra = out["extra_fields"]
    assert extra["polar_status"] == "COMPLETED" and extra["polar_masked_reason"] is None
    with PolarClient(api.url) as client:
        check_kept_chain(client, extra["polar_rollout_id"], out["response_ids"], out["response_mask"])
    assert out["as_dict"]["response_mask"] == out["response_mask"]
