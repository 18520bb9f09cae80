"""Row factories for the store tests: plain functions and one capture-tree builder, with sensible defaults.

``CaptureTreeBuilder`` writes captures the way the gateway does: given a capture's full prompt and its parent,
it stores only the tokens beyond the longest shared prefix with the parent's sequence, and remembers every full
prompt so tests can check what ``full_prompt_ids`` rebuilds against the truth.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from db.models import Capture, Rollout, Task


def add_task(session: Session, **overrides: Any) -> Task:
    fields: dict[str, Any] = {
        "instruction": "Fix the failing test in repo/",
        "harness": {"name": "codex", "args": ["--full-auto"]},
        "runtime": {"kind": "local"},
        "evaluator": {"kind": "command", "command": "pytest -q"},
        "num_samples": 4,
        "timeout_s": 600.0,
        "meta": {"group": "g1", "step": 3},
    }
    task = Task(**(fields | overrides))
    session.add(task)
    session.flush()
    return task


def add_rollout(session: Session, **overrides: Any) -> Rollout:
    rollout = Rollout(**overrides)
    session.add(rollout)
    session.flush()
    return rollout


def shared_prefix_len(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class CaptureTreeBuilder:
    """Adds captures of one rollout, numbering ``seq`` and deriving ``prefix_len`` and the prompt delta."""

    def __init__(self, session: Session, rollout: Rollout):
        self.session = session
        self.rollout = rollout
        self.full_prompts: dict[int, list[int]] = {}
        self._outputs: dict[int, list[int]] = {}
        self._next_seq = 0

    def sequence_of(self, capture: Capture) -> list[int]:
        """Full prompt + output: what a child's prompt extends."""
        return self.full_prompts[capture.id] + self._outputs[capture.id]

    def add(
        self,
        full_prompt: list[int],
        output_ids: list[int],
        *,
        parent: Capture | None = None,
        logprobs: list[float] | None = None,
        **overrides: Any,
    ) -> Capture:
        if parent is None:
            prefix_len = 0
            render_mode = "append"
        else:
            parent_sequence = self.sequence_of(parent)
            prefix_len = shared_prefix_len(parent_sequence, full_prompt)
            render_mode = "append" if prefix_len == len(parent_sequence) else "canonical"
        delta = full_prompt[prefix_len:]
        fields: dict[str, Any] = {
            "rollout_id": self.rollout.id,
            "seq": self._next_seq,
            "protocol": "openai_chat",
            "model": "tiny",
            "request_json": {"model": "tiny", "messages": [{"role": "user", "content": f"turn {self._next_seq}"}]},
            "response_json": {"choices": [{"message": {"role": "assistant", "content": "ok"}}]},
            "parent_id": parent.id if parent is not None else None,
            "prefix_len": prefix_len,
            "prompt_delta_ids": delta,
            "output_ids": output_ids,
            "output_logprobs": logprobs if logprobs is not None else [-0.25] * len(output_ids),
            "finish_reason": "stop",
            "weight_version": "v1",
            "version_spans": [{"version": "v1", "start": 0, "end": len(output_ids)}],
            "sampling_params": {"temperature": 1.0, "max_new_tokens": 64},
            "render_mode": render_mode,
            "backend": "local",
            "n_prompt": len(full_prompt),
            "n_prompt_delta": len(delta),
            "n_output": len(output_ids),
        }
        capture = Capture(**(fields | overrides))
        self.session.add(capture)
        self.session.flush()
        self._next_seq += 1
        self.full_prompts[capture.id] = list(full_prompt)
        self._outputs[capture.id] = list(output_ids)
        return capture
