"""The closed loop with TRL: ``GRPOTrainer`` trains the tiny local model on the toy task through the whole Polar
stack, its rollouts coming from ``polar.integrations.trl.PolarRolloutFunc``.

``python -m examples.trl_grpo`` runs it (see ``loop.main``).
"""
