"""Adapters that let third-party RL trainers drive Polar through the control API.

Each submodule is optional and imports its trainer only where it has to: ``import polar`` (and
``polar.integrations.groups``) never needs TRL or verl installed.

- ``groups``: a finished Polar task as a group of per-sample token sequences (trainer-agnostic);
- ``trl``: a ``rollout_func`` for TRL's ``GRPOTrainer`` and the reward function that reads its rewards (TRL itself
  is not imported: the trainer is duck-typed);
- ``verl``: a verl agent loop (``PolarAgentLoop``); importing it needs verl (see docs/trainers.md).
"""
