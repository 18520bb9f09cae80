"""The non-streaming half of a model call: generate within the deadline, check, parse, commit, then answer."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from polar.errors import PolarError
from polar.proxy.call.generation import Generation, finished
from polar.proxy.call.plan import CallPlan
from polar.proxy.call.record import CallRecorder
from polar.slices import turn


async def complete(plan: CallPlan, generation: Generation, recorder: CallRecorder) -> dict[str, Any]:
    """The response body, once its capture committed. A failed generation is recorded before it is raised;
    ``Overloaded`` (no in-flight slot, before any generation) records nothing."""
    slot = await generation.slot(plan)
    generating = time.perf_counter()
    try:
        try:
            async with asyncio.timeout(generation.deadline_s):
                final = await plan.policy.generate(generation.request(plan), plan.context)
        except TimeoutError:
            raise generation.timeout() from None
        finally:
            slot()
            generated_s = time.perf_counter() - generating
        generation.check(plan).result(final)
    except PolarError as exc:
        await recorder.failure(plan, exc)
        raise
    await turn()
    completion = generation.completion(plan, final, generation.parse(plan, final.output_ids))
    response = plan.codec.response(completion, request=plan.request)
    await recorder.reply(plan, final, completion, response)
    finished(plan, final, generated_s)
    return response
