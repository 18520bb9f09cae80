"""The one recorder of a call's outcome: a reply, a failure, or a reply its caller never received.

A reply is committed (``commit_reply``, which also counts it in the call metrics) before the caller sees its end,
and becomes a known call of the session (a parent for the next). A failed generation is committed as an ERROR
capture (``failure``) before the error reaches the caller; if even that fails, the caller still gets its original
error. A committed reply whose caller left before the last byte is marked ``UNACKNOWLEDGED`` and forgotten as a
parent (``undelivered``), streamed or not. A stream whose caller left before its reply was whole is committed as
an ``UNACKNOWLEDGED`` capture holding its prompt and the ids sampled so far (``cut``), never nothing.
"""

from __future__ import annotations

import logging
import time
from array import array
from collections.abc import Sequence
from typing import Any

from db.enums import CaptureStatus
from db.models import Capture
from db.request_json import compact_known, compact_request, is_delta
from polar import metrics
from polar.capture_extras import apply_extras
from polar.errors import PolarError
from polar.inference import FinishReason, GenerateResult
from polar.proxy import access_log
from polar.proxy.call.generation import Generated
from polar.proxy.call.plan import CallPlan
from polar.proxy.capture.pending import Stored
from polar.proxy.capture.row import capture_row
from polar.proxy.capture.writer import CaptureWriter
from polar.proxy.session.call_node import CallNode
from polar.proxy.session.cut import CutReply
from polar.proxy.session.history import HistoryCache
from polar.slices import turn
from polar.store_bound import in_store
from polar.tokens.messages import Message, Role
from polar.wire.canonical import Completion
from polar.wire.replies import minted_ids

log = logging.getLogger(__name__)


class CallRecorder:
    def __init__(self, writer: CaptureWriter, histories: HistoryCache, *, store_timeout_s: float = 30.0):
        self.writer = writer
        self.histories = histories
        self.store_timeout_s = store_timeout_s  # every store wait of a call: a frozen store is a 503 within it

    async def commit_reply(
        self, plan: CallPlan, generated: Generated, completion: Completion
    ) -> tuple[int, dict[str, Any]]:
        """The call's reply, in its protocol, committed (``reply``) and counted; returns its capture's id and the
        response body."""
        response = plan.codec.response(completion, request=plan.request)
        capture_id = await self.reply(plan, generated.final, completion, response)
        final = generated.final
        metrics.CALLS.labels(plan.codec.name, "ok").inc()
        added_s = max(0.0, time.perf_counter() - plan.started - generated.seconds)  # beyond generation
        metrics.ADDED_LATENCY.labels(plan.codec.name).observe(added_s)
        metrics.TOKENS.labels("in").inc(len(plan.prompt.ids))
        metrics.TOKENS.labels("out").inc(len(final.output_ids))
        return capture_id, response

    async def reply(
        self, plan: CallPlan, final: GenerateResult, completion: Completion, response: dict[str, Any]
    ) -> int:
        """Commit the reply's capture and make it a known call of the session; returns its id."""
        row = await self._row(plan, final, response_json=response)
        apply_extras(row, final.extras, plan.session.capture)
        row.n_malformed_tool_calls = completion.malformed_tool_calls
        stored = await self._commit(plan, row)
        if plan.digest is not None:
            self.histories.remember_digest(plan.session.id, stored.id, plan.digest)
        reply = Message(Role.ASSISTANT, completion.content, completion.reasoning, completion.tool_calls)
        parent = plan.prompt.parent
        self.histories.add(
            plan.session.id,
            CallNode(
                id=stored.id,
                parent_id=parent.ref if parent is not None else None,
                prefix_len=plan.prompt.prefix_len,
                prompt_delta_ids=array("i", plan.prompt.delta_ids),
                output_ids=array("i", final.output_ids),
                n_prompt=len(plan.prompt.ids),
                messages=plan.request.messages,
                tools=plan.request.tools,
                reply=reply,
                seq=stored.seq,
                minted=minted_ids(plan.codec.name, response),
            ),
            plan.prompt.ids,
        )
        return stored.id

    async def failure(self, plan: CallPlan, error: PolarError) -> None:
        """Commit a failed generation. If even that fails, the original error still reaches the caller."""
        try:
            text = f"{error.error_type}: {error.message}".replace("\x00", "\\x00")  # a text column
            stored = await self._commit(plan, await self._row(plan, None, error=text))
            self.histories.note_seq(plan.session.id, stored.seq)
        except PolarError:
            log.warning("could not record the failed call of session %s", plan.session.id)

    async def cut(self, plan: CallPlan, ids: Sequence[int], logprobs: Sequence[float], reply: Message) -> None:
        """A generation whose caller left before its reply was whole (and before it committed): committed as an
        ``UNACKNOWLEDGED`` capture with its prompt and the ``ids`` sampled so far (finish reason ``abort``, the cause
        in ``error``), never trained and never a parent; and remembered as a cut reply (``reply``: those ids parsed,
        ``polar.proxy.session.cut``), so a later request that kept its partial text is not taken for the client's
        own words. Remembered even when the store refuses the row (the refusal is logged)."""
        capture_id = None
        try:
            cause = f"client_left: the caller left after {len(ids)} sampled tokens, before the reply ended"
            row = await self._row(plan, None, error=cause)
            row.status = CaptureStatus.UNACKNOWLEDGED
            row.output_ids, row.output_logprobs, row.n_output = list(ids), list(logprobs), len(ids)
            row.finish_reason = FinishReason.ABORT.value
            stored = await self._commit(plan, row)
            capture_id = stored.id
            self.histories.note_seq(plan.session.id, stored.seq)
        except PolarError:
            log.warning("could not record the cut call of session %s", plan.session.id)
        sealed = tuple(message.sealed for message in plan.request.messages)
        self.histories.note_cut(plan.session.id, CutReply(capture_id, sealed, plan.request.tools, reply))

    def undelivered(self, plan: CallPlan, capture_id: int) -> None:
        """The committed reply ``capture_id`` never reached its caller: marked ``UNACKNOWLEDGED`` (never trained)
        and dropped from the session's history (never a parent)."""
        self.writer.unacknowledge(capture_id)
        self.histories.drop(plan.session.id, capture_id)

    async def _row(self, plan: CallPlan, final: GenerateResult | None, **fields: Any) -> Capture:
        row = capture_row(
            rollout_id=plan.session.id,
            seq=-1,  # assigned by the writer
            protocol=plan.codec.name,
            model=plan.request.model,
            backend=plan.policy.name,
            request_json=await self._stored_request(plan),
            prompt=plan.prompt,
            sampling=plan.sampling,
            result=final,
            **fields,
        )
        row.scripted = plan.policy.scripted
        row.admission, row.admission_cause = plan.admission.admission.value, plan.admission.cause
        return row

    async def _commit(self, plan: CallPlan, row: Capture) -> Stored:
        committing = time.perf_counter()
        stored = await self.writer.store(row, timeout_s=self.store_timeout_s, key_hash=plan.session.key_hash)
        waited = time.perf_counter() - committing
        metrics.COMMIT_WAIT.observe(waited)
        access_log.noted(row, waited)  # the call's line in the access log, if on
        await turn()  # a group commit wakes its whole batch at once
        return stored

    async def _stored_request(self, plan: CallPlan) -> Any:
        """The request as stored: relative to the parent capture's (db.request_json); what it repeats of the
        parent's is known from their digests in the steady state, else from the parent's body read from the store."""
        parent = plan.prompt.parent
        if parent is None or parent.ref is None:
            return compact_request(plan.whole_body(), None)
        parent_digest = self.histories.digest_in_memory(plan.session.id, parent.ref)
        if plan.digest is not None and parent_digest is not None:
            repeats = plan.digest.repeats(parent_digest)
            kept, cut = repeats.kept_counts(), plan.cut
            if cut is None or (kept.get(cut.key) == cut.count and not is_delta(plan.body)):  # the parent's are cut
                cuts = {cut.key: cut.count} if cut is not None else None
                return compact_known(plan.body, repeats.same_keys(), kept, cuts)
            return compact_known(plan.whole_body(), repeats.same_keys(), kept)
        parent_body = await in_store(
            self.histories.parent_body, plan.session.id, parent.ref, timeout_s=self.store_timeout_s
        )
        return compact_request(plan.whole_body(), parent_body)
