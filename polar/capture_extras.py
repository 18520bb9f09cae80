"""Top-k logprobs and routed experts on a capture: the per-task/per-session options that ask for them, the request
a call then makes, and the compact columns they are stored in (``db.models.Capture``).

Storage, per capture and only where asked:

- ``top_k``, ``top_ids``: int32 little-endian, (n_output, k); ``top_logprobs``: float32 (default, exact to the
  server's value) or float16 (half the bytes, about 1e-3 relative error), told apart by their length;
- ``experts_start``, ``experts_layers``, ``experts_k``, ``routed_experts``: uint8 (up to 256 experts) or uint16,
  (rows, layers, k) for positions ``[experts_start, n_prompt + n_output - 1)``, told apart by their length. A call
  extending its parent asks the server only for the positions its parent lacks (``extras_request``), so a
  session's experts take one row per position of its capture tree, not one per call and position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from polar.errors import ConfigError, InvalidRequest
from polar.inference import ExtrasRequest, GenerateExtras
from polar.tokens.render import Prompt


class CaptureOptions(BaseModel):
    """What a task's (or session's) calls capture beyond sampled ids and logprobs: ``top_logprobs: k`` and
    ``routed_experts: true`` (a MoE model)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    top_logprobs: int = Field(default=0, ge=0, le=256, description="top-k logprobs per sampled token (0: none)")
    routed_experts: bool = Field(default=False, description="the MoE experts of every token (rollout routing replay)")
    top_logprobs_dtype: Literal["float32", "float16"] = Field(
        default="float32", description="how top-k logprobs are stored"
    )

    @property
    def any(self) -> bool:
        return bool(self.top_logprobs or self.routed_experts)


def options_of(raw: Any) -> CaptureOptions | None:
    """Stored options (a session's ``policy.capture``), or None when nothing extra is asked."""
    if not raw:
        return None
    options = CaptureOptions.model_validate(raw)
    return options if options.any else None


def extras_request(options: CaptureOptions | None, prompt: Prompt) -> ExtrasRequest | None:
    """The extras one call asks the server for. Routed experts start where the parent's stop: its own rows cover
    ``[.., parent sequence - 1)`` (its last sampled id was never fed), and this call shares ``prefix_len`` of it."""
    if options is None:
        return None
    start = 0
    parent = prompt.parent
    if options.routed_experts and parent is not None:
        start = max(min(prompt.prefix_len, parent.sequence_length - 1), 0)
    return ExtrasRequest(
        top_logprobs=options.top_logprobs, routed_experts=options.routed_experts, routed_experts_start=start
    )


def apply_extras(row: Any, extras: GenerateExtras | None, options: CaptureOptions | None) -> None:
    """Set a capture row's extras columns from a generation's extras (nothing when none were asked)."""
    if extras is None:
        return
    if extras.top_ids is not None and extras.top_logprobs is not None:
        dtype = "<f2" if options is not None and options.top_logprobs_dtype == "float16" else "<f4"
        row.top_k = int(extras.top_ids.shape[1])
        row.top_ids = np.ascontiguousarray(extras.top_ids, dtype="<i4").tobytes()
        row.top_logprobs = np.ascontiguousarray(extras.top_logprobs, dtype=dtype).tobytes()
    if extras.routed_experts is not None:
        experts = extras.routed_experts
        wide = experts.dtype.itemsize > 1 and experts.size and int(experts.max()) > 255
        row.experts_start = int(extras.routed_experts_start)
        row.experts_layers, row.experts_k = int(experts.shape[1]), int(experts.shape[2])
        row.routed_experts = np.ascontiguousarray(experts, dtype="<u2" if wide else "u1").tobytes()


@dataclass(frozen=True, eq=False)
class StoredExtras:
    """A capture's extras, decoded: top-k (n_output, k) and experts (rows, layers, k) from ``experts_start``."""

    top_ids: np.ndarray | None
    top_logprobs: np.ndarray | None
    routed_experts: np.ndarray | None
    experts_start: int


def stored_extras(row: Any) -> StoredExtras:
    """Decode the extras columns of a capture row (any object with the columns as attributes)."""
    top_ids = top_logprobs = experts = None
    n_output = int(row.n_output or 0)
    if row.top_k and row.top_ids is not None and row.top_logprobs is not None:
        k = int(row.top_k)
        top_ids = np.frombuffer(row.top_ids, dtype="<i4").reshape(n_output, k)
        width = len(row.top_logprobs) // max(n_output * k, 1)
        top_logprobs = np.frombuffer(row.top_logprobs, dtype="<f2" if width == 2 else "<f4").astype(np.float32)
        top_logprobs = top_logprobs.reshape(n_output, k)
    if row.routed_experts is not None and row.experts_layers and row.experts_k:
        per_row = int(row.experts_layers) * int(row.experts_k)
        rows = int(row.n_prompt) + n_output - 1 - int(row.experts_start or 0)
        width = len(row.routed_experts) // max(rows * per_row, 1) if rows > 0 else 1
        experts = np.frombuffer(row.routed_experts, dtype="<u2" if width == 2 else "u1")
        experts = experts.reshape(-1, int(row.experts_layers), int(row.experts_k))
    return StoredExtras(top_ids, top_logprobs, experts, int(row.experts_start or 0))


def verified_options(spec: str) -> CaptureOptions:
    """``POLAR_CAPTURE_EXTRAS`` ("top_logprobs=8,routed_experts"; "" for none): what the gateway checks the
    backend returns at start, and so the most a session may ask."""
    top, routed = 0, False
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        name, _, value = item.partition("=")
        if name == "top_logprobs" and value.isdigit() and int(value) > 0:
            top = int(value)
        elif name == "routed_experts" and not value:
            routed = True
        else:
            raise ConfigError(
                f"POLAR_CAPTURE_EXTRAS: cannot read {item!r}; expected top_logprobs=K (K >= 1) and/or routed_experts",
                field="capture_extras",
            )
    return CaptureOptions(top_logprobs=top, routed_experts=routed)


def check_capture(options: CaptureOptions | None, spec: str) -> None:
    """Refuse (400, naming the field) a session asking for an extra the gateway did not verify at start."""
    if options is None:
        return
    verified = verified_options(spec)
    if options.top_logprobs > verified.top_logprobs:
        raise InvalidRequest(
            f"capture.top_logprobs={options.top_logprobs} is more than this gateway checked its backend returns "
            f"({verified.top_logprobs}; set POLAR_CAPTURE_EXTRAS=top_logprobs=K)",
            field="capture.top_logprobs",
        )
    if options.routed_experts and not verified.routed_experts:
        raise InvalidRequest(
            "capture.routed_experts was not checked against this gateway's backend at start "
            "(set POLAR_CAPTURE_EXTRAS=routed_experts)",
            field="capture.routed_experts",
        )
