"""Polar: a rollout system that trains real agent harnesses as black boxes.

The package is organised by job, in the layers pyproject.toml's import-linter contract keeps (docs/architecture.md
lists every component): ``cli`` (the ``polar`` command) on top; ``api`` (the control API), ``ui``, ``live``;
``rollout``; ``proxy`` (the gateway); ``backends`` (inference servers behind one protocol), ``serving`` (an
SGLang-compatible HTTP server for the local model), ``export``; ``models`` (the local models), ``chat`` (chat
formats), ``trajectory``, ``httpserve`` (what both servers share: bodies, auth first, header timeouts);
``wire`` (the four provider protocols), ``model_folder``; ``inference`` (the Backend contract), ``tokens``,
``runtime``, ``feed``, ``alarms``; and the leaves (``errors``, ``settings``, ``metrics``, ``ids``, ``clock``).

Users import from the modules themselves: ``polar.client.PolarClient`` (the control API), ``polar.settings``,
``polar.errors``; importing ``polar`` alone loads nothing else.
"""

__version__ = "0.1.0"
