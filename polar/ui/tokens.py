"""A trajectory as text, token by token, in pages: what the UI colours by loss mask and logprob.

The sequence is the stored prompt ids, then the response ids with their loss mask and logprobs, exactly as the
``trajectories`` row holds them (nothing is re-tokenised). Each token is decoded on its own (once per distinct
id, then cached), so a multi-byte character split across tokens shows as replacement characters, which is what
the model saw. Long traces are cut into pages of ``PAGE_TOKENS`` so a 100k-token trajectory never renders whole.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from db.models import Trajectory
from polar.errors import PolarError
from polar.settings import Settings
from polar.trajectory.records import PLACEHOLDER_LOGPROB

PAGE_TOKENS = 2000
HEAT_LEVELS = 10


class TokenText:
    """Decodes single token ids with the configured model's tokenizer (``⟨id⟩`` when it cannot be loaded)."""

    def __init__(self, decode_one: Callable[[int], str] | None):
        self._decode_one = decode_one
        self._cache: dict[int, str] = {}

    @classmethod
    def for_settings(cls, settings: Settings) -> TokenText:
        try:
            from polar.models.tiny import named_tokenizer

            tokenizer = named_tokenizer(settings.model, settings.cache_dir)
        except (PolarError, OSError):  # a model this UI cannot load: show ids, never fail the page
            return cls(None)
        return cls(lambda token_id: tokenizer.decode([token_id]))

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._decode_one(token_id) if self._decode_one is not None else f"⟨{token_id}⟩"
            self._cache[token_id] = text
        return text


@dataclass(frozen=True)
class Token:
    """One token of the page. ``mask`` is None on prompt tokens, else the stored loss mask value; ``logprob`` is
    None where the row holds a placeholder; ``version`` is set where a new weight version's span starts."""

    position: int
    token_id: int
    text: str
    mask: int | None
    logprob: float | None
    heat: int | None
    version: str | None


@dataclass(frozen=True)
class TokenPage:
    trajectory_id: int
    page: int
    pages: int
    start: int
    end: int
    n_prompt: int
    n_response: int
    tokens: list[Token]


def heat(logprob: float) -> int:
    """0 (unlikely) .. HEAT_LEVELS-1 (certain): the token's probability in tenths."""
    return min(HEAT_LEVELS - 1, max(0, int(math.exp(logprob) * HEAT_LEVELS)))


def _span_starts(spans: Sequence[dict[str, Any]]) -> dict[int, str]:
    """Response positions where the sampling weight version changes, with the new version."""
    starts: dict[int, str] = {}
    last: str | None = None
    for span in sorted(spans or (), key=lambda s: int(s.get("start", 0))):
        version = span.get("version")
        if version is not None and version != last:
            starts[int(span.get("start", 0))] = str(version)
            last = version
    return starts


def token_page(row: Trajectory, text: TokenText, page: int, *, page_size: int | None = None) -> TokenPage:
    """Page ``page`` (0-based, clamped) of ``row``'s prompt + response tokens, ``page_size`` (default
    ``PAGE_TOKENS``) tokens a page."""
    page_size = page_size or PAGE_TOKENS
    prompt, response = list(row.prompt_ids), list(row.response_ids)
    mask, logprobs = list(row.loss_mask), list(row.response_logprobs)
    n = len(prompt) + len(response)
    pages = max(1, math.ceil(n / page_size))
    page = min(max(page, 0), pages - 1)
    start, end = page * page_size, min(n, (page + 1) * page_size)
    starts = _span_starts(row.version_spans)
    tokens: list[Token] = []
    for position in range(start, end):
        if position < len(prompt):
            token_id = prompt[position]
            tokens.append(Token(position, token_id, text(token_id), None, None, None, None))
            continue
        i = position - len(prompt)
        token_id, m, lp = response[i], int(mask[i]), float(logprobs[i])
        real = m == 1 or lp != PLACEHOLDER_LOGPROB
        tokens.append(
            Token(
                position,
                token_id,
                text(token_id),
                m,
                lp if real else None,
                heat(lp) if real else None,
                starts.get(i),
            )
        )
    return TokenPage(row.id, page, pages, start, end, len(prompt), len(response), tokens)


def token_html(page: TokenPage) -> str:
    """The page's tokens as spans: ``t p`` on prompt tokens; ``t m1``/``t m0`` (trainable / inserted, the stored
    loss mask, also as ``data-m``) with heat class ``h0``..``h9`` and ``data-lp`` where a real logprob exists; a
    ``vb`` marker where a weight version starts. Built here rather than in the template: a page has thousands
    of spans and Jinja's per-token overhead is most of a long rollout's render time."""
    parts: list[str] = []
    for t in page.tokens:
        if t.version is not None:
            v = html.escape(t.version)
            parts.append(f'<span class="vb" title="weight version {v} starts here">v:{v}</span>')
        text = html.escape(t.text, quote=False)
        if t.mask is None:
            parts.append(f'<span class="t p">{text}</span>')
            continue
        heat_class = f" h{t.heat}" if t.heat is not None else ""
        lp = f' data-lp="{t.logprob:.4f}"' if t.logprob is not None else ""
        parts.append(f'<span class="t m{t.mask}{heat_class}" data-m="{t.mask}"{lp}>{text}</span>')
    return "".join(parts)
