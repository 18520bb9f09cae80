"""A closed-loop GRPO example: the tiny local model trained on a toy task through the whole Polar stack.

``python -m examples.grpo`` runs it (see ``loop.main``); ``trainer`` holds the GRPO update, ``toy`` the task.
"""
