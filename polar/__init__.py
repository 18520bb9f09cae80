"""Polar: a rollout system that trains real agent harnesses as black boxes.

The package is organised by job (docs/architecture.md lists every component): ``proxy`` (the gateway),
``tokens`` (tokenizer, chat template, parsers, prompt building), ``backends`` (inference servers behind one
protocol), ``models`` (the tiny local model), ``serving`` (an SGLang-compatible HTTP server for the local model),
``trajectory``, ``rollout``, ``runtime``, ``evaluators``, ``api``, ``feed``, ``export``.
"""

__version__ = "0.1.0"
