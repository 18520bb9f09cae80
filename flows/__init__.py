"""Thin Prefect wrappers around ``polar.rollout`` stages (the rollout, batch and maintenance flows)."""
