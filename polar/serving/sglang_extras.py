"""SGLang's wire fields for the extras of a generation (pure functions), as its ``TokenizerManager`` writes them:

- ``meta_info.output_top_logprobs``: per output position a list of ``[logprob, token_id, text | null]`` for the
  ``top_logprobs_num`` most likely ids, most likely first (text only with ``return_text_in_logprobs``);
- ``meta_info.output_token_ids_logprobs``: per output position the same triples for the ids of
  ``token_ids_logprob``, in the order asked;
- ``meta_info.routed_experts``: base64 of the little-endian int32 array (positions, layers, top_k) of the experts
  each layer routed positions ``[routed_experts_start_len, prompt + output - 1)`` to; only in the finished
  response (SGLang reads its capturer when the request ends).

With incremental streaming the two per-position lists are sliced like ``output_token_logprobs``.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from polar.tokens.tokenizer import ChatTokenizer


def triples_of(tokenizer: ChatTokenizer, ids: np.ndarray, logprobs: np.ndarray, *, with_text: bool) -> list[list[Any]]:
    """One position's ``[[logprob, id, text | null], ...]``."""
    return [
        [float(lp), int(tid), tokenizer.decode([int(tid)]) if with_text else None]
        for lp, tid in zip(logprobs.tolist(), ids.tolist(), strict=True)
    ]


def routed_experts_b64(experts: np.ndarray) -> str:
    """SGLang's ``routed_experts`` value: the (positions, layers, k) array as base64 of int32 (little-endian)."""
    return base64.b64encode(np.ascontiguousarray(experts, dtype="<i4").tobytes()).decode("ascii")
