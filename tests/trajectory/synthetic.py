"""Synthetic agent sessions as capture records, for property tests and benchmarks.

A ``SessionSimulator`` plays a harness against a pretend model: each call renders its conversation with the real
``PromptBuilder`` (append mode by default, or canonical) and a real tokenizer, picks its parent the way the
gateway does (``PromptBuilder.find_parent`` over the earlier successful calls), and "samples" a reply whose ids
are an encoding of its text. Along the way it makes what real sessions contain: tool calls and results, new
user turns, parallel branches, retries of an identical request, failed calls, compactions and sub-agents (new
roots), replies truncated by the token limit, replies sampled as a non-canonical tokenisation of their text
(which canonical re-rendering then drifts from), weight updates between and inside replies, and unparseable
tool calls. Every choice goes through a ``Chooser``, so the same simulator runs from a seeded RNG or from a
property-testing library's draws (which then shrink failing sessions to small ones).

``write_session`` stores a generated session as capture rows of a rollout.

Logprobs are unique per sampled token (-(n+1)/1024 for the n-th token of the session, exact in float32), so a
test can tell which sampled token any logprob belongs to.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Protocol

from sqlalchemy.orm import Session

from db.enums import CaptureStatus
from db.models import Capture
from polar.settings import RenderMode
from polar.tokens.messages import Message, ToolCall, ToolSpec, assistant, system, tool_result, user
from polar.tokens.render import PriorCall, PromptBuilder
from polar.tokens.tokenizer import ChatTokenizer
from polar.trajectory.records import CaptureRecord, VersionRange

TOOLS = (ToolSpec("bash", "Run a shell command", {"type": "object", "properties": {"cmd": {"type": "string"}}}),)
WORDS = ("ls", "the", "file", "tests", "fix", "import", "error", "done", "run", "patch", "config", "ok", "src")


class Chooser(Protocol):
    def integer(self, low: int, high: int) -> int:
        """An integer in [low, high]."""
        ...

    def chance(self, p: float) -> bool:
        """True with probability about ``p``; never draws when ``p`` is 0."""
        ...


class RandomChooser:
    def __init__(self, seed: int):
        self._rng = random.Random(seed)

    def integer(self, low: int, high: int) -> int:
        return self._rng.randint(low, high)

    def chance(self, p: float) -> bool:
        return p > 0 and self._rng.random() < p


@dataclass(frozen=True)
class SessionShape:
    """Per-call odds of each event, and sizes."""

    branch: float = 0.1  # continue from a random earlier call instead of the current one
    retry: float = 0.08  # send the previous request again, unchanged
    compact: float = 0.05  # replace the history with a summary: a new root
    subagent: float = 0.05  # start a sub-agent conversation: a new root
    fail: float = 0.05  # the backend fails the call (an ERROR capture), and the harness retries it
    tool_call: float = 0.4
    truncate: float = 0.15  # the reply is cut by the token limit (no end-of-turn sampled)
    drift: float = 0.2  # the reply is sampled as a non-canonical tokenisation of its text
    version_bump: float = 0.1  # weights change before the call
    version_mid_reply: float = 0.1  # weights change while the reply is generated
    malformed: float = 0.05  # the reply holds a tool call the gateway could not parse
    rerender: float = 0.0  # an append-mode session renders this call canonically (history re-tokenised)
    reply_words: tuple[int, int] = (1, 8)
    tool_output_chars: int = 40


LINEAR_TOOL_SESSION = SessionShape(
    branch=0,
    retry=0,
    compact=0,
    subagent=0,
    fail=0,
    tool_call=1.0,
    truncate=0,
    drift=0,
    version_bump=0,
    version_mid_reply=0,
    malformed=0,
    reply_words=(8, 24),
    tool_output_chars=400,
)
"""A plain agent loop: every reply calls a tool, every result is ~400 characters (the benchmark's session)."""


@dataclass(frozen=True)
class SyntheticSession:
    """The captures of one session (``seq`` order) and the truth about them: every capture's full prompt."""

    captures: tuple[CaptureRecord, ...]
    full_prompts: dict[int, tuple[int, ...]] = field(hash=False)


class SessionSimulator:
    """Generates one session; ``run(calls)`` makes about ``calls`` successful calls (failed ones come on top)."""

    def __init__(
        self,
        tokenizer: ChatTokenizer,
        chooser: Chooser,
        *,
        shape: SessionShape = SessionShape(),
        mode: RenderMode = RenderMode.APPEND,
    ):
        self.tokenizer = tokenizer
        self.builder = PromptBuilder(tokenizer)
        self.choose = chooser
        self.shape = shape
        self.mode = mode
        self._calls: list[PriorCall] = []  # the successful calls: the gateway's parent candidates
        self._records: list[CaptureRecord] = []
        self._prompts: dict[int, tuple[int, ...]] = {}
        self._current: PriorCall | None = None  # the call the harness continues from
        self._last_request: tuple[Message, ...] | None = None
        self._version = 0
        self._tokens = 0
        self._roots = 0

    def run(self, calls: int) -> SyntheticSession:
        for _ in range(calls):
            self._call(self._next_request())
        return SyntheticSession(tuple(self._records), dict(self._prompts))

    def _next_request(self) -> tuple[Message, ...]:
        shape, choose = self.shape, self.choose
        if self._current is None or choose.chance(shape.subagent):
            return self._new_root("You are a sub-agent." if self._current else "You are a coding agent.")
        if self._last_request is not None and choose.chance(shape.retry):
            return self._last_request
        if choose.chance(shape.compact):
            return self._new_root("You are a coding agent.", summary=True)
        base = self._current
        if choose.chance(shape.branch):
            base = self._calls[choose.integer(0, len(self._calls) - 1)]
        return self._extend(base)

    def _new_root(self, system_text: str, *, summary: bool = False) -> tuple[Message, ...]:
        self._roots += 1
        task = f"Summary of the work so far ({self._roots}); continue." if summary else f"Task {self._roots}: fix it."
        return (system(system_text), user(task))

    def _extend(self, base: PriorCall) -> tuple[Message, ...]:
        reply = base.reply
        n = len(self._records)
        if reply.tool_calls:
            follow = [tool_result(self._tool_output(n), c.id) for c in reply.tool_calls]
        else:
            follow = [user(f"Continue with step {n}.")]
        return (*base.messages, reply, *follow)

    def _tool_output(self, n: int) -> str:
        """About ``tool_output_chars`` of a directory listing (text shaped like real tool results)."""
        lines = [f"output of call {n}:"]
        while sum(len(line) + 1 for line in lines) < self.shape.tool_output_chars:
            i = len(lines)
            lines.append(f"-rw-r--r-- 1 root root {n * 37 + i:>6} Nov 29 12:00 file_{n}_{i}.py")
        return "\n".join(lines)

    def _call(self, messages: tuple[Message, ...]) -> None:
        if self.choose.chance(self.shape.fail):
            self._record(messages, failed=True)  # the harness then retries the same request
        self._record(messages, failed=False)
        self._last_request = messages

    def _record(self, messages: tuple[Message, ...], *, failed: bool) -> None:
        candidates = self._calls
        mode = RenderMode.CANONICAL if self.choose.chance(self.shape.rerender) else self.mode
        prompt = self.builder.build(messages, TOOLS, candidates, mode=mode)
        capture_id = len(self._records) + 1
        parent_id = prompt.parent.ref if prompt.parent is not None else None
        self._prompts[capture_id] = tuple(prompt.ids)
        if failed:
            failure = CaptureRecord(
                id=capture_id,
                seq=capture_id - 1,
                parent_id=parent_id,
                prefix_len=prompt.prefix_len,
                prompt_delta_ids=tuple(prompt.delta_ids),
                output_ids=(),
                output_logprobs=(),
                status=CaptureStatus.ERROR,
                render_mode=prompt.mode.value,
            )
            self._records.append(failure)
            return
        reply, output_ids, finish = self._sample()
        logprobs = tuple(-(self._tokens + i + 1) / 1024 for i in range(len(output_ids)))
        self._tokens += len(output_ids)
        spans = self._versions(len(output_ids))
        self._records.append(
            CaptureRecord(
                id=capture_id,
                seq=capture_id - 1,
                parent_id=parent_id,
                prefix_len=prompt.prefix_len,
                prompt_delta_ids=tuple(prompt.delta_ids),
                output_ids=output_ids,
                output_logprobs=logprobs,
                finish_reason=finish,
                weight_version=spans[-1].version,  # as capture_row does: the version it finished under
                version_spans=spans,
                render_mode=prompt.mode.value,
                n_malformed_tool_calls=int(self.choose.chance(self.shape.malformed)),
            )
        )
        self._current = PriorCall(messages, TOOLS, reply, tuple(prompt.ids), output_ids, ref=capture_id)
        self._calls.append(self._current)

    def _sample(self) -> tuple[Message, tuple[int, ...], str]:
        """A reply, the ids "sampled" for it, and the finish reason."""
        shape, choose = self.shape, self.choose
        low, high = shape.reply_words
        text = " ".join(WORDS[choose.integer(0, len(WORDS) - 1)] for _ in range(choose.integer(low, high)))
        calls: tuple[ToolCall, ...] = ()
        if choose.chance(shape.tool_call):
            cmd = WORDS[choose.integer(0, len(WORDS) - 1)]
            calls = (ToolCall("bash", json.dumps({"cmd": cmd}), f"call_{len(self._records)}"),)
        reply = assistant(text, tool_calls=calls)
        ids = self._encode(self.builder.template.assistant_body(reply))
        if not calls and len(ids) > 1 and choose.chance(shape.truncate):
            cut = tuple(ids[: choose.integer(1, len(ids) - 1)])
            # The harness sees the text of what was sampled, cut short, and echoes it back.
            return assistant(self.tokenizer.decode(cut)), cut, "length"
        return reply, (*ids, self.tokenizer.im_end_id), "stop"

    def _encode(self, text: str) -> list[int]:
        """The canonical encoding, or (drift) the encodings of two pieces of the text: same text, other ids."""
        if len(text) > 1 and self.choose.chance(self.shape.drift):
            cut = self.choose.integer(1, len(text) - 1)
            return self.tokenizer.encode(text[:cut]) + self.tokenizer.encode(text[cut:])
        return self.tokenizer.encode(text)

    def _versions(self, n: int) -> tuple[VersionRange, ...]:
        if self.choose.chance(self.shape.version_bump):
            self._version += 1
        if n > 1 and self.choose.chance(self.shape.version_mid_reply):
            at = self.choose.integer(1, n - 1)
            self._version += 1
            return (VersionRange(f"v{self._version - 1}", 0, at), VersionRange(f"v{self._version}", at, n))
        return (VersionRange(f"v{self._version}", 0, n),)


def write_session(db: Session, rollout_id: str, session: SyntheticSession) -> dict[int, int]:
    """Insert ``session``'s captures as rows of ``rollout_id`` (the store assigns ids); returns synthetic id ->
    stored id. Flushes, does not commit."""
    stored: dict[int, int] = {}
    for record in session.captures:
        row = Capture(
            rollout_id=rollout_id,
            seq=record.seq,
            protocol="openai_chat",
            model="synthetic",
            request_json={"synthetic": True, "seq": record.seq},
            response_json=None,
            parent_id=stored[record.parent_id] if record.parent_id is not None else None,
            prefix_len=record.prefix_len,
            prompt_delta_ids=list(record.prompt_delta_ids),
            output_ids=list(record.output_ids),
            output_logprobs=list(record.output_logprobs),
            finish_reason=record.finish_reason,
            weight_version=record.weight_version,
            version_spans=[span.as_json() for span in record.version_spans],
            sampling_params={},
            render_mode=record.render_mode,
            backend="synthetic",
            status=record.status,
            n_prompt=len(session.full_prompts[record.id]),
            n_prompt_delta=len(record.prompt_delta_ids),
            n_output=len(record.output_ids),
            n_malformed_tool_calls=record.n_malformed_tool_calls,
        )
        db.add(row)
        db.flush()
        stored[record.id] = row.id
    return stored
