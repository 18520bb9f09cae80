"""Turning one generation into one capture row (the store's unit of record)."""

from __future__ import annotations

from array import array
from typing import Any

from sqlalchemy.orm import instrumentation

from db.enums import CaptureStatus
from db.models import Capture
from polar.inference import GenerateResult, SamplingParams
from polar.tokens.render import Prompt


def capture_row(
    *,
    rollout_id: str,
    seq: int,
    protocol: str,
    model: str,
    backend: str,
    request_json: dict[str, Any],
    prompt: Prompt,
    sampling: SamplingParams,
    result: GenerateResult | None,
    response_json: dict[str, Any] | None = None,
    error: str | None = None,
) -> Capture:
    """A Capture holding the prompt as a capture-tree delta and the sampled ids exactly as returned.

    ``prompt.parent.ref`` must be the parent capture's id. A failed generation (``result is None``) is
    recorded as an ERROR capture with its prompt, so nothing that was asked is lost.
    """
    parent = prompt.parent
    return _capture(
        rollout_id=rollout_id,
        seq=seq,
        protocol=protocol,
        model=model,
        backend=backend,
        request_json=request_json,
        response_json=response_json,
        parent_id=parent.ref if parent is not None else None,
        prefix_len=prompt.prefix_len,
        # An int32 array, not a list: a 400k-token cold start's delta as Python ints took ~13 ms of the event loop
        # here and as long again in the writer packing it back (``encode_int32`` copies an array in one memcpy).
        prompt_delta_ids=array("i", prompt.delta_ids),  # any Iterable[int] binds
        output_ids=list(result.output_ids) if result else [],
        output_logprobs=list(result.output_logprobs) if result else [],
        finish_reason=result.finish_reason.value if result else None,
        matched_stop=result.matched_stop if result else None,
        weight_version=result.weight_version if result else None,
        version_spans=[{"version": s.version, "start": s.start, "end": s.end} for s in result.version_spans]
        if result
        else [],
        sampling_params=sampling.model_dump(mode="json"),
        render_mode=prompt.mode.value,
        fallback_reason=prompt.fallback_reason,
        logprob_semantics=result.logprob_semantics.value if result else None,
        status=CaptureStatus.OK if result else CaptureStatus.ERROR,
        error=error,
        latency_s=result.e2e_s if result else None,
        ttft_s=result.ttft_s if result else None,
        server=result.server if result else None,
        n_prompt=len(prompt.ids),
        n_prompt_delta=len(prompt.delta_ids),
        n_output=len(result.output_ids) if result else 0,
    )


_NEW_CAPTURE = instrumentation.manager_of_class(Capture).new_instance


def _capture(**values: Any) -> Capture:
    """A Capture holding ``values``, made without the ORM's per-attribute events (a twentieth of a call's CPU at 64
    in flight): its only reader is the capture writer, which encodes a row from its instance dict
    (``polar.proxy.capture.sql``), and no ORM session ever flushes it. Attributes set later (the writer's seq and id)
    go through the ORM as usual."""
    row = _NEW_CAPTURE()
    row.__dict__.update(values)
    return row
