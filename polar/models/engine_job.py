"""One generation in the local engine: its ids so far, its cache, and the extras it was asked to keep (top-k
logprobs per sampled token, routed experts per fed position), turned into SGLang-shaped ``GenerateExtras``."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from transformers.cache_utils import Cache

from polar.inference import ExtrasRequest, GenerateExtras, GenerateRequest, LogprobSemantics
from polar.models.moe import RouterTap, logprob_rows, top_k_of

_NO_EXTRAS = ExtrasRequest()


@dataclass(eq=False)
class Job:
    request: GenerateRequest
    generator: torch.Generator
    pending: list[int]  # ids not yet fed to the model
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    version_events: list[tuple[str, int]] = field(default_factory=list)
    cache: Cache | None = None
    aborted: str | None = None  # abort message
    # Set by a retract from any thread, applied by the worker thread before its next step: clearing the
    # cache from outside could interleave with a step in flight and leave it decoding without its prefix.
    recompute: bool = False
    # Extras (ExtrasRequest): per sampled token its top-k ids and logprobs and the asked ids' logprobs; the
    # experts of every fed position from ``routed_from`` on (a recompute after a retract overwrites its rows).
    top_ids: list[np.ndarray] = field(default_factory=list)
    top_logprobs: list[np.ndarray] = field(default_factory=list)
    id_logprobs: list[np.ndarray] = field(default_factory=list)
    routed: list[np.ndarray] = field(default_factory=list)
    routed_from: int = 0

    def needs_recompute(self) -> None:
        self.recompute = True

    @property
    def extras(self) -> ExtrasRequest:
        return self.request.extras or _NO_EXTRAS

    def keep_top(self, logits: torch.Tensor, semantics: LogprobSemantics) -> None:
        """The sampled position's top-k and asked-id logprobs, with the sampled logprob's semantics."""
        params = self.request.sampling
        rows = logprob_rows(logits, params.temperature, semantics, params.greedy)
        if self.extras.top_logprobs:
            ids, values = top_k_of(rows, self.extras.top_logprobs)
            self.top_ids.append(ids)
            self.top_logprobs.append(values)
        if self.extras.token_ids:
            self.id_logprobs.append(rows[list(self.extras.token_ids)].numpy().astype(np.float32))

    def keep_routing(self, tap: RouterTap | None, position: int) -> None:
        """Append the experts of the positions just fed (from ``position`` on), dropping rows they recompute."""
        assert tap is not None
        rows = tap.take()
        if not self.routed:
            self.routed_from = position
        elif position < self.routed_from + sum(len(r) for r in self.routed):  # a recompute after a retract
            kept = np.concatenate(self.routed)[: max(position - self.routed_from, 0)]
            self.routed = [kept] if len(kept) else []
            if not self.routed:
                self.routed_from = position
        self.routed.append(rows)

    def token_extras(self) -> GenerateExtras | None:
        """The newest token's top-k and asked-id logprobs, as (1, k) arrays, when asked."""
        if not (self.extras.top_logprobs or self.extras.token_ids):
            return None
        return GenerateExtras(
            top_ids=self.top_ids[-1][None] if self.extras.top_logprobs else None,
            top_logprobs=self.top_logprobs[-1][None] if self.extras.top_logprobs else None,
            token_ids_logprobs=self.id_logprobs[-1][None] if self.extras.token_ids else None,
        )

    def final_extras(self, tap: RouterTap | None) -> GenerateExtras | None:
        """All of the extras: top-k per sampled token; experts for positions [start, prompt + output - 1)."""
        asked = self.extras
        if not asked.any:
            return None
        k, n_ids = asked.top_logprobs, len(asked.token_ids)
        routed = None
        if asked.routed_experts and tap is not None:
            empty = np.zeros((0, tap.shape.layers, tap.shape.top_k), np.uint8)
            rows = np.concatenate(self.routed) if self.routed else empty
            end = len(self.request.input_ids) + len(self.output) - 1  # the last sampled id is never fed
            routed = rows[asked.routed_experts_start - self.routed_from : end - self.routed_from]
        return GenerateExtras(
            top_ids=_stacked(self.top_ids, k, np.int32),
            top_logprobs=_stacked(self.top_logprobs, k, np.float32),
            token_ids_logprobs=_stacked(self.id_logprobs, n_ids, np.float32),
            routed_experts=routed,
            routed_experts_start=asked.routed_experts_start,
        )


def _stacked(rows: list[np.ndarray], width: int, dtype: type[np.generic]) -> np.ndarray | None:
    """``rows`` as one (n, width) array; an empty one when nothing was kept; None when none was asked."""
    if not width:
        return None
    return np.stack(rows) if rows else np.zeros((0, width), dtype)
