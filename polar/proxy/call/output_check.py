"""Backend output checked before it is decoded, stored or sent (impossible output is never OK).

Whatever backend produced them (SGLang, vLLM, the local engine, a scripted policy), the sampled ids of one call
must be ids the tokenizer knows (``0 <= id < vocab_size``), there is at least one of them (an empty output is an
engine fault: every turn ends on a sampled id) and no more than the call allowed (``max_new_tokens``), each must
have exactly one logprob, and every logprob must be a finite number (not a boolean) and not positive (a log
probability is at most 0). Every other field of the result that reaches a
capture, a header or a metric is checked too: the finish reason is one of ours, a matched stop token id is in
the vocabulary (a matched stop string is a bounded string), weight versions are non-empty strings of at most
``MAX_VERSION_CHARS`` printable characters (the store's column) whose spans are integers covering the output
in order, the prompt token count is a non-negative integer, timings are finite and not negative, and no chunk
follows the final one. A violation is a ``BackendProtocolError`` naming the first bad field; the gateway then
records an ERROR capture and answers an error in the caller's protocol (an error event in a stream), so a bad
value never reaches the tokenizer, the store, a metric or the harness.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from polar.errors import BackendProtocolError
from polar.inference import FinishReason, GenerateResult, VersionSpan

LOGPROB_SLACK = 1e-3
"""Float rounding lets a certain token's logprob come out a hair above 0; more than this is impossible."""
MAX_VERSION_CHARS = 128
"""The longest weight version a capture can hold (its ``String(128)`` column)."""
MAX_STOP_CHARS = 4096
"""The longest matched stop string accepted from a backend (a stop string is the caller's, and short)."""
MAX_SERVER_CHARS = 2048
"""The longest server name (a fleet member's URL) accepted on a result."""
MAX_SECONDS = 366 * 24 * 3600.0
"""No generation takes a year: a timing beyond it is a backend's garbage, not a measurement."""
MAX_PROMPT_TOKENS = 2**31 - 1
_PRINTABLE = re.compile(r"[^\x00-\x1f\x7f]+")


class OutputCheck:
    """Checks one call's output, chunk by chunk (streams) or whole (``result``)."""

    def __init__(self, *, vocab_size: int, max_new_tokens: int):
        self.vocab_size = vocab_size
        self.max_new_tokens = max_new_tokens
        self.seen = 0  # ids accepted so far in this call
        self.done = False  # the final result was checked: nothing may follow it

    def chunk(self, ids: Sequence[int], logprobs: Sequence[float]) -> None:
        """Check newly streamed ids and their logprobs (raises ``BackendProtocolError``)."""
        if self.done:
            raise BackendProtocolError(f"the backend sent {len(ids)} more token ids after its final chunk")
        if len(ids) != len(logprobs):
            raise BackendProtocolError(f"the backend sent {len(ids)} token ids with {len(logprobs)} logprobs")
        self._ids(ids, self.seen)
        self._logprobs(logprobs, self.seen)
        self.seen += len(ids)
        self._count(self.seen)

    def result(self, result: GenerateResult, *, streamed: bool = False) -> None:
        """Check a final result; after a stream, its ids must be exactly as many as the chunks carried."""
        ids, logprobs = result.output_ids, result.output_logprobs
        if len(ids) != len(logprobs):
            raise BackendProtocolError(f"the backend returned {len(ids)} token ids but {len(logprobs)} logprobs")
        if streamed and len(ids) != self.seen:
            raise BackendProtocolError(f"the backend streamed {self.seen} token ids but its result holds {len(ids)}")
        self._count(len(ids))
        self._some(result)
        self._ids(ids, 0)
        self._logprobs(logprobs, 0)
        self._spans(result.version_spans, len(ids))
        self._finish(result)
        prompt_tokens = result.prompt_tokens
        if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int):
            raise BackendProtocolError(f"the backend reported prompt_tokens {prompt_tokens!r}, not an integer")
        if not 0 <= prompt_tokens <= MAX_PROMPT_TOKENS:
            raise BackendProtocolError(f"the backend reported prompt_tokens {prompt_tokens}, out of range")
        _seconds("ttft", result.ttft_s)
        _seconds("e2e_latency", result.e2e_s)
        if result.server is not None:
            _text("server", result.server, MAX_SERVER_CHARS)
        self.done = True

    def _finish(self, result: GenerateResult) -> None:
        if not isinstance(result.finish_reason, FinishReason):
            raise BackendProtocolError(f"the backend's finish reason {result.finish_reason!r} is not one we know")
        matched = result.matched_stop
        if matched is None:
            return
        if isinstance(matched, str):
            _text("the matched stop string", matched, MAX_STOP_CHARS, printable=False)
        elif isinstance(matched, bool) or not isinstance(matched, int) or not 0 <= matched < self.vocab_size:
            raise BackendProtocolError(
                f"the backend's matched stop token {matched!r} is outside the vocabulary of {self.vocab_size} ids"
            )

    @staticmethod
    def _spans(spans: Sequence[VersionSpan], n_output: int) -> None:
        """Weight-version spans: bounded printable versions over integer ranges covering the output in order."""
        at = 0
        for span in spans:
            _text("weight version", span.version, MAX_VERSION_CHARS)
            for name in ("start", "end"):
                value = getattr(span, name)
                if isinstance(value, bool) or not isinstance(value, int):
                    raise BackendProtocolError(f"a weight-version span's {name} is {value!r}, not an integer")
            if span.start != at or not span.start <= span.end <= n_output:
                raise BackendProtocolError(
                    f"the backend's weight-version spans do not cover its {n_output} output tokens in order "
                    f"(a span [{span.start}, {span.end}) after {at})"
                )
            at = span.end
        if spans and at != n_output:
            raise BackendProtocolError(
                f"the backend's weight-version spans end at {at}, not at the {n_output} output tokens"
            )

    @staticmethod
    def _some(result: GenerateResult) -> None:
        """At least one id: every generation samples one (a turn ends on a sampled stop id), so none is an engine
        fault (stored as OK it was a reply of nothing, neither trainable nor continuable)."""
        if not result.output_ids:
            reason = getattr(result.finish_reason, "value", result.finish_reason)
            raise BackendProtocolError(
                f"the backend returned no output tokens (finish reason {reason!r}); a generation samples at least one"
            )

    def _count(self, n: int) -> None:
        if n > self.max_new_tokens:
            raise BackendProtocolError(
                f"the backend returned {n} tokens but at most {self.max_new_tokens} were allowed"
            )

    def _ids(self, ids: Sequence[int], offset: int) -> None:
        for i, token in enumerate(ids):
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < self.vocab_size:
                raise BackendProtocolError(
                    f"the backend returned token id {token!r} at output position {offset + i}, outside the "
                    f"vocabulary of {self.vocab_size} ids"
                )

    @staticmethod
    def _logprobs(logprobs: Sequence[float], offset: int) -> None:
        for i, value in enumerate(logprobs):
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value > LOGPROB_SLACK
            ):
                raise BackendProtocolError(
                    f"the backend returned logprob {value!r} at output position {offset + i}; a logprob must be "
                    "a finite number <= 0"
                )


def _seconds(name: str, value: float | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_SECONDS:
        raise BackendProtocolError(f"the backend reported {name} {value!r}; a duration is a finite number >= 0")


def _text(name: str, value: object, limit: int, *, printable: bool = True) -> None:
    """A string of 1..``limit`` characters; ``printable``: no control characters (NUL included)."""
    if not isinstance(value, str) or not value or len(value) > limit:
        shown = repr(value)[:80]
        raise BackendProtocolError(f"the backend's {name} {shown} is not a string of 1 to {limit} characters")
    if printable and not _PRINTABLE.fullmatch(value):
        raise BackendProtocolError(f"the backend's {name} {value!r:.80} holds a control character")
    if "\x00" in value:
        raise BackendProtocolError(f"the backend's {name} {value!r:.80} holds a NUL character")
