"""Polar: a rollout system that trains real agent harnesses as black boxes.

The package is organised by job (docs/architecture.md lists every component): ``wire`` (the four provider
protocols), ``inference`` (the Backend contract), ``proxy`` (the gateway), ``tokens`` and ``chat`` (tokenizers,
chat formats, parsers, prompt building), ``backends`` (inference servers behind one protocol), ``models`` (the tiny
local model), ``serving`` (an SGLang-compatible HTTP server for the local model), ``trajectory``, ``rollout``,
``runtime``, ``evaluators``, ``tasks``, ``api``, ``feed``, ``export``, ``report``, ``live`` and ``alarms``.

Users import from the modules themselves: ``polar.client.PolarClient`` (the control API), ``polar.settings``,
``polar.errors``; importing ``polar`` alone loads nothing else.
"""

__version__ = "0.1.0"
