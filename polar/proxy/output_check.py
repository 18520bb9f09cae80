"""Backend output checked before it is decoded, stored or sent (impossible output is never OK).

Whatever backend produced them (SGLang, vLLM, the local engine, a scripted policy), the sampled ids of one call
must be ids the tokenizer knows (``0 <= id < vocab_size``), there may be no more of them than the call allowed
(``max_new_tokens``), each must have exactly one logprob, and every logprob must be finite and not positive
(a log probability is at most 0). A violation is a ``BackendProtocolError`` naming the first bad position; the
gateway then records an ERROR capture and answers an error in the caller's protocol (an error event in a
stream), so a bad token never reaches the tokenizer, the store or the harness.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from polar.backends.base import GenerateResult
from polar.errors import BackendProtocolError

LOGPROB_SLACK = 1e-3
"""Float rounding lets a certain token's logprob come out a hair above 0; more than this is impossible."""


class OutputCheck:
    """Checks one call's output, chunk by chunk (streams) or whole (``result``)."""

    def __init__(self, *, vocab_size: int, max_new_tokens: int):
        self.vocab_size = vocab_size
        self.max_new_tokens = max_new_tokens
        self.seen = 0  # ids accepted so far in this call

    def chunk(self, ids: Sequence[int], logprobs: Sequence[float]) -> None:
        """Check newly streamed ids and their logprobs (raises ``BackendProtocolError``)."""
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
        self._ids(ids, 0)
        self._logprobs(logprobs, 0)
        if result.version_spans and result.version_spans[-1].end != len(ids):
            raise BackendProtocolError(
                f"the backend's weight-version spans end at {result.version_spans[-1].end}, not at the "
                f"{len(ids)} output tokens"
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
            if not isinstance(value, int | float) or not math.isfinite(value) or value > LOGPROB_SLACK:
                raise BackendProtocolError(
                    f"the backend returned logprob {value!r} at output position {offset + i}; a logprob must be "
                    "a finite number <= 0"
                )
