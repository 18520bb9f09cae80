"""The web UI of ``polar serve`` at ``/ui``: rollouts, groups, one rollout's stages, capture tree and
trajectories token by token, and two rollouts side by side. See docs/ui.md."""

from polar.ui.routes import install_ui

__all__ = ["install_ui"]
