"""The closed loop through the control API: claims, GRPO update, published weights reloaded by the backend,
and every sample drawn under exactly the version live for its step (admission control at async level 0)."""

from __future__ import annotations

import torch

from examples.grpo.loop import run_closed_loop, version_name
from examples.grpo.trainer import GRPOTrainer, advantages
from polar.client import PolarClient


def test_group_advantages_are_normalised_and_zero_without_spread():
    assert advantages([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0]
    a = advantages([0.0, 1.0])
    assert abs(a[0] + 1) < 1e-5 and abs(a[1] - 1) < 1e-5


def test_closed_loop_publishes_versions_the_backend_serves(api, api_engine, tiny_model_dir):
    trainer = GRPOTrainer(tiny_model_dir)
    with PolarClient(api.url) as client:
        records = run_closed_loop(client, trainer, steps=2, groups=1, samples=3, seed=0, log=lambda *_: None)
        assert [r.version for r in records] == [version_name(0), version_name(1)]
        assert client.weights()["current"] == version_name(2)
    # The captured logprobs are the trainer's own under the weights it published: token-faithful end to end.
    assert all(r.stats.max_logprob_gap < 1e-4 and r.stats.trajectories == 3 for r in records)
    assert api_engine.weight_version == version_name(2)
    live = api_engine.model.state_dict()
    assert all(torch.equal(live[k], v) for k, v in trainer.state_dict().items())
