"""Polar: a rollout system that trains real agent harnesses as black boxes.

The package is organised by job: ``tokens`` (tokenizer, chat template, parsers, prompt building),
``backends`` (inference servers behind one protocol), ``models`` (the tiny local model),
``serving`` (an SGLang-compatible HTTP server for the local model). See ../DESIGN.md.
"""

__version__ = "0.1.0"
