"""The non-streaming half of a model call: generate within the deadline, check, parse, commit, then answer (the
HTTP layer sends the body and reports a caller that left before it: ``polar.proxy.http.delivery``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from polar.errors import PolarError
from polar.proxy.call.generation import Generation
from polar.proxy.call.plan import CallPlan
from polar.proxy.call.record import CallRecorder
from polar.slices import turn


@dataclass(frozen=True)
class Reply:
    """A committed reply: its capture, and the response body its caller is owed. Delivered or not is the HTTP
    layer's to say (``CallRecorder.undelivered`` when the caller left before the body was handed over)."""

    capture_id: int
    body: dict[str, Any]


async def complete(plan: CallPlan, generation: Generation, recorder: CallRecorder) -> Reply:
    """The reply, once its capture committed. A failed generation is recorded before it is raised; ``Overloaded``
    (no in-flight slot, before any generation) records nothing."""
    slot = await generation.slot(plan)
    try:
        generated = await generation.generate(plan, slot)
    except PolarError as exc:
        await recorder.failure(plan, exc)
        raise
    await turn()
    capture_id, body = await recorder.commit_reply(plan, generated, generation.completion(plan, generated.final))
    return Reply(capture_id, body)
