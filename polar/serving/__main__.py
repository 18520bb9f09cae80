"""``python -m polar.serving``: the same as ``polar serve-model``."""

from polar.serving.command import main

main()
