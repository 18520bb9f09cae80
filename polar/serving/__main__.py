"""``python -m polar.serving``: the same as ``polar serve-model``."""

from polar.serving.launch import main

main()
