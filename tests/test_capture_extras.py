"""Extras on captures: the compact columns round-trip through the capture writer (SQLite and Postgres), the
options a session may ask, and stitching along the capture tree (deltas, gaps, wide expert ids)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest
import sqlalchemy as sa

from db import Capture, Rollout, session_scope
from polar.capture_extras import (
    CaptureOptions,
    apply_extras,
    check_capture,
    extras_request,
    stored_extras,
    verified_options,
)
from polar.errors import ConfigError, InvalidRequest
from polar.inference import GenerateExtras
from polar.proxy.capture.writer import CaptureWriter
from polar.settings import RenderMode
from polar.tokens.messages import Message, Role
from polar.tokens.render import PriorCall, Prompt
from polar.trajectory.extras import stitch
from tests.pg import STORES, migrated_factory


def _extras(n_prompt: int, n_output: int, start: int, k: int = 3, experts: int = 8) -> GenerateExtras:
    rng = np.random.default_rng(n_prompt + start)
    rows = n_prompt + n_output - 1 - start
    return GenerateExtras(
        top_ids=rng.integers(0, 1000, (n_output, k)).astype(np.int32),
        top_logprobs=-rng.random((n_output, k)).astype(np.float32),
        routed_experts=rng.integers(0, experts, (rows, 2, 2)).astype(np.uint16 if experts > 256 else np.uint8),
        routed_experts_start=start,
    )


def _capture(rollout_id: str, extras: GenerateExtras, options: CaptureOptions | None = None) -> Capture:
    row = Capture(
        rollout_id=rollout_id,
        seq=0,
        protocol="openai_chat",
        model="tiny-moe",
        request_json={"messages": []},
        prompt_delta_ids=[1, 2, 3, 4],
        output_ids=[5, 6],
        output_logprobs=[-0.5, -0.25],
        render_mode="append",
        backend="sglang",
        n_prompt=4,
        n_prompt_delta=4,
        n_output=2,
    )
    apply_extras(row, extras, options)
    return row


@pytest.fixture(params=STORES)
def factory(request, tmp_path):
    with migrated_factory(request.param, tmp_path) as made:
        yield made


def test_the_writer_stores_extras_compactly_and_they_decode_back(factory):
    with session_scope(factory) as db:
        rollout = Rollout()
        db.add(rollout)
    plain, half, wide = _extras(4, 2, 0), _extras(4, 2, 0), _extras(4, 2, 0, experts=300)
    rows = [
        _capture(rollout.id, plain),
        _capture(rollout.id, half, CaptureOptions(top_logprobs=3, top_logprobs_dtype="float16")),
        _capture(rollout.id, wide),
    ]

    async def write() -> list:
        writer = CaptureWriter(factory)
        try:
            return [await writer.write(row, timeout_s=30) for row in rows]
        finally:
            writer.close()

    asyncio.run(write())
    with session_scope(factory) as db:
        stored = db.scalars(sa.select(Capture).where(Capture.rollout_id == rollout.id).order_by(Capture.seq)).all()
        decoded = [stored_extras(c) for c in stored]
        sizes = [(len(c.top_ids), len(c.top_logprobs), len(c.routed_experts)) for c in stored]
    assert sizes == [(24, 24, 20), (24, 12, 20), (24, 24, 40)]  # int32 ids; float32/16; uint8/16 experts
    for got, sent in zip(decoded, [plain, half, wide], strict=True):
        assert np.array_equal(got.top_ids, sent.top_ids) and np.array_equal(got.routed_experts, sent.routed_experts)
    assert np.array_equal(decoded[0].top_logprobs, plain.top_logprobs)
    assert np.abs(decoded[1].top_logprobs - half.top_logprobs).max() < 1e-3


def _node(prefix_len: int, delta: list[int], output: list[int], n_prompt: int, start: int, experts=None, top=True):
    rng = np.random.default_rng(n_prompt * 7 + start)
    rows = n_prompt + len(output) - 1 - start
    block = experts if experts is not None else rng.integers(0, 8, (rows, 2, 2)).astype(np.uint8)
    row = SimpleNamespace(prefix_len=prefix_len, prompt_delta_ids=delta, output_ids=output, n_prompt=n_prompt)
    row.n_output = len(output)
    for name in ("top_k", "top_ids", "top_logprobs", "experts_start", "experts_layers", "experts_k", "routed_experts"):
        setattr(row, name, None)
    top_ids = np.asarray([[t, t + 1] for t in output], np.int32)
    apply_extras(
        row,
        GenerateExtras(
            top_ids=top_ids if top else None,
            top_logprobs=-np.ones((len(output), 2), np.float32) if top else None,
            routed_experts=block,
            routed_experts_start=start,
        ),
        None,
    )
    return row, block


def test_stitching_keeps_one_row_per_token_of_the_last_sequence():
    root, r_rows = _node(0, [1, 2, 3], [4, 5], 3, 0)  # positions 0..3 routed (5 tokens, last unfed)
    child, c_rows = _node(5, [6, 7], [8], 7, 4)  # extends all 5: asks from position 4 (the root's last id)
    # A sibling that re-rendered the reply: shares 4 tokens, its experts start there.
    stitched = stitch([root, child])
    assert stitched.ids.tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert stitched.routed_experts is not None and len(stitched.routed_experts) == 8
    assert np.array_equal(stitched.routed_experts[:4], r_rows) and np.array_equal(stitched.routed_experts[4:7], c_rows)
    assert stitched.experts_mask.tolist() == [True] * 7 + [False]
    assert stitched.top_mask.tolist() == [False, False, False, True, True, False, False, True]
    assert stitched.top_ids[3].tolist() == [4, 5] and stitched.top_ids[0].tolist() == [-1, -1]

    shorter, s_rows = _node(3, [9], [10], 4, 3)  # shares only the root's prompt: drops the root's reply rows
    stitched = stitch([root, shorter])
    assert stitched.ids.tolist() == [1, 2, 3, 9, 10]
    assert np.array_equal(stitched.routed_experts[:3], r_rows[:3]) and np.array_equal(
        stitched.routed_experts[3:4], s_rows
    )


def test_a_gap_or_a_call_without_them_leaves_the_sequence_without_extras():
    root, _ = _node(0, [1, 2, 3], [4, 5], 3, 0)
    gap, _ = _node(5, [6, 7], [8], 7, 6)  # starts after the root's last row (4): a position nobody routed
    assert stitch([root, gap]).routed_experts is None
    bare, _ = _node(5, [6, 7], [8], 7, 4, top=False)
    assert stitch([root, bare]).top_ids is None
    wide, w_rows = _node(5, [6, 7], [8], 7, 4, experts=np.full((3, 2, 2), 300, np.uint16))
    stitched = stitch([root, wide])
    assert stitched.routed_experts.dtype == np.uint16 and stitched.routed_experts[4:7].tolist() == w_rows.tolist()


def test_a_call_asks_experts_only_for_the_positions_its_parent_lacks():
    parent = PriorCall((), (), Message(Role.ASSISTANT, "hi"), prompt_ids=[1, 2, 3], output_ids=[4, 5])
    options = CaptureOptions(top_logprobs=2, routed_experts=True)

    def prompt(prefix_len: int, parent: PriorCall | None = parent) -> Prompt:
        return Prompt(
            ids=[1, 2, 3, 4, 5, 6][: max(prefix_len, 1)], mode=RenderMode.APPEND, parent=parent, prefix_len=prefix_len
        )

    assert extras_request(options, prompt(5)).routed_experts_start == 4  # the parent's last sampled id: never fed
    assert extras_request(options, prompt(3)).routed_experts_start == 3  # a re-rendered reply: from where it differs
    assert extras_request(options, prompt(0, None)).routed_experts_start == 0
    append = prompt(5)
    assert extras_request(None, append) is None


def test_sessions_may_ask_only_what_the_gateway_checked():
    assert verified_options("top_logprobs=8, routed_experts") == CaptureOptions(top_logprobs=8, routed_experts=True)
    with pytest.raises(ConfigError, match="POLAR_CAPTURE_EXTRAS"):
        verified_options("top_logprobs=0")
    check_capture(CaptureOptions(top_logprobs=4), "top_logprobs=8")
    with pytest.raises(InvalidRequest) as refused:
        check_capture(CaptureOptions(routed_experts=True), "top_logprobs=8")
    assert refused.value.field == "capture.routed_experts"
