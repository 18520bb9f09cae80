"""Helpers for the trajectory tests: a record-level capture-tree builder, a hypothesis-backed chooser for the
session simulator, and the invariants every build must satisfy, checked against the simulator's truth."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hypothesis import strategies as st

from db.enums import CaptureStatus
from polar.tokens.tokenizer import ChatTokenizer
from polar.trajectory.records import PLACEHOLDER_LOGPROB, BuildResult, CaptureRecord, Trace, VersionRange
from tests.trajectory.synthetic import SyntheticSession

EOT = 2  # the end-of-turn id in hand-made trees


class RecordTree:
    """Hand-made capture records: give each capture's full prompt; prefix and delta follow from the parent.

    ``prefix_len`` defaults to the longest prefix shared with the parent's sequence (what the gateway stores).
    """

    def __init__(self) -> None:
        self.records: list[CaptureRecord] = []
        self.full_prompts: dict[int, tuple[int, ...]] = {}

    def sequence(self, record: CaptureRecord) -> tuple[int, ...]:
        return self.full_prompts[record.id] + record.output_ids

    def add(
        self,
        prompt: list[int] | tuple[int, ...],
        output: list[int] | tuple[int, ...],
        parent: CaptureRecord | None = None,
        *,
        prefix_len: int | None = None,
        **fields: Any,
    ) -> CaptureRecord:
        prompt = tuple(prompt)
        if prefix_len is None:
            prefix_len = 0
            if parent is not None:
                for a, b in zip(self.sequence(parent), prompt, strict=False):
                    if a != b:
                        break
                    prefix_len += 1
        capture_id = len(self.records) + 1
        status = fields.pop("status", CaptureStatus.OK)
        logprobs = fields.pop("logprobs", None)
        if logprobs is None:
            logprobs = (
                []
                if status is CaptureStatus.ERROR
                else [-(capture_id * 100 + i + 1) / 1024 for i in range(len(output))]
            )
        record = CaptureRecord(
            id=capture_id,
            seq=capture_id - 1,
            parent_id=parent.id if parent else None,
            prefix_len=prefix_len,
            prompt_delta_ids=prompt[prefix_len:],
            output_ids=tuple(output),
            output_logprobs=tuple(logprobs),
            finish_reason=fields.pop("finish_reason", "stop" if tuple(output[-1:]) == (EOT,) else "length"),
            status=status,
            **fields,
        )
        self.records.append(record)
        self.full_prompts[record.id] = prompt
        return record


class DrawChooser:
    """The simulator's choices drawn from hypothesis, shrinking towards a plain session (no events)."""

    def __init__(self, data: st.DataObject):
        self.data = data

    def integer(self, low: int, high: int) -> int:
        return self.data.draw(st.integers(low, high))

    def chance(self, p: float) -> bool:
        if p <= 0:
            return False
        return self.data.draw(st.integers(0, 99)) >= round(100 * (1 - p))


def _call_key(
    records: Sequence[CaptureRecord], full_prompts: Mapping[int, tuple[int, ...]]
) -> Callable[[CaptureRecord], tuple[int | None, tuple[int, ...]]]:
    """A call's identity as a retry sees it: its nearest OK ancestor and its full prompt."""
    by_id = {r.id: r for r in records}

    def key(record: CaptureRecord) -> tuple[int | None, tuple[int, ...]]:
        parent = record.parent_id
        while parent is not None and not by_id[parent].ok:
            parent = by_id[parent].parent_id
        return parent, full_prompts[record.id]

    return key


def _retry_groups(
    records: Sequence[CaptureRecord], full_prompts: Mapping[int, tuple[int, ...]]
) -> tuple[list[list[CaptureRecord]], set[int | None], set[int | None]]:
    """OK calls with the same nearest OK ancestor and the same full prompt (one call retried), grouped; the calls
    with an OK child (continued); the calls a child singled out by echoing their minted ids (witnessed)."""
    key = _call_key(records, full_prompts)
    ok = [r for r in records if r.ok]
    continued = {key(r)[0] for r in ok}
    witnessed = {key(r)[0] for r in ok if r.admission_cause == "echoed_ids"}
    groups: dict[tuple[int | None, tuple[int, ...]], list[CaptureRecord]] = {}
    for record in ok:
        groups.setdefault(key(record), []).append(record)
    return list(groups.values()), continued, witnessed


def dead_retries(records: Sequence[CaptureRecord], full_prompts: Mapping[int, tuple[int, ...]]) -> set[int]:
    """The oracle for dead branches, from the true full prompts: OK calls with the same nearest OK ancestor and
    the same full prompt are one call retried; the live one is each member with an OK child, else the latest."""
    groups, continued, _ = _retry_groups(records, full_prompts)
    dead: set[int] = set()
    for members in groups:
        live = [m for m in members if m.id in continued] or [max(members, key=lambda m: m.seq)]
        dead.update(m.id for m in members if m not in live)
    return dead


def ambiguous_retries(records: Sequence[CaptureRecord], full_prompts: Mapping[int, tuple[int, ...]]) -> set[int]:
    """The oracle for ambiguous retries: a retry group (as in ``dead_retries``) one of whose continued members
    sampled the very ids another member did, with other logprobs, and that no child singled out by echoing its
    minted ids (``admission_cause`` ``echoed_ids``): which twin the harness kept cannot be told, so every member
    of the group is untrained. So is every member of a group none of whose members was continued (a final retry)
    sent back to back (no other call between them), unless all its copies are one record."""
    groups, continued, witnessed = _retry_groups(records, full_prompts)
    ambiguous: set[int] = set()
    for members in groups:
        if len(members) > 1 and not any(m.id in continued for m in members):  # a final retry: no later witness
            low, high = min(m.seq for m in members), max(m.seq for m in members)
            key = _call_key(records, full_prompts)
            between = any(low < r.seq < high and key(r) != key(members[0]) for r in records)
            if not between and any(
                (m.output_ids, m.output_logprobs) != (members[0].output_ids, members[0].output_logprobs)
                for m in members
            ):
                ambiguous.update(m.id for m in members)
            continue
        unwitnessed = [m for m in members if m.id in continued and m.id not in witnessed]
        if any(
            m.output_ids == other.output_ids and m.output_logprobs != other.output_logprobs
            for m in unwitnessed
            for other in members
            if other is not m
        ):
            ambiguous.update(m.id for m in members)
    return ambiguous


def untrained_retries(records: Sequence[CaptureRecord], full_prompts: Mapping[int, tuple[int, ...]]) -> set[int]:
    """Retry members whose tokens no trace trains: dead branches and ambiguous groups."""
    return dead_retries(records, full_prompts) | ambiguous_retries(records, full_prompts)


def terminal_chain(
    records: Sequence[CaptureRecord], dead: set[int], traces: Sequence[Trace]
) -> tuple[int | None, set[int]]:
    """The chain index of the first trace through the session's terminal call (its latest OK, live call) and
    the captures of that trace up to the terminal call: the chain the harness kept (none when no call is live)."""
    live = [r for r in records if r.ok and r.id not in dead]
    if not live:
        return None, set()
    terminal = live[-1].id
    for trace in traces:
        if terminal in trace.capture_ids:
            return trace.chain_index, set(trace.capture_ids[: trace.capture_ids.index(terminal) + 1])
    raise AssertionError("no trace holds the terminal call")


def sampled_tokens(session: SyntheticSession) -> Counter[tuple[int, float]]:
    """(token id, logprob) of every sampled token of the OK, live captures; logprobs are unique per token."""
    dead = untrained_retries(session.captures, session.full_prompts)
    return Counter(
        (token, logprob)
        for record in session.captures
        if record.ok and record.id not in dead
        for token, logprob in zip(record.output_ids, record.output_logprobs, strict=True)
    )


def expected_versions(session: SyntheticSession) -> dict[float, str | None]:
    """logprob -> the weight version its token was sampled under."""
    versions: dict[float, str | None] = {}
    for record in session.captures:
        per_token: list[str | None] = [None] * len(record.output_ids)
        for span in record.sampled_versions():
            per_token[span.start : span.end] = [span.version] * (span.end - span.start)
        versions.update(zip(record.output_logprobs, per_token, strict=True))
    return versions


def check_common(session: SyntheticSession, result: BuildResult) -> None:
    """What holds for every builder: aligned arrays, every sampled token trained exactly once with its own
    logprob and version, every OK capture in some trace, placeholders exactly on inserted tokens."""
    ok_ids = {record.id for record in session.captures if record.ok}
    trained: Counter[tuple[int, float]] = Counter()
    versions = expected_versions(session)
    for trace in result.traces:
        assert len(trace.response_ids) == len(trace.loss_mask) == len(trace.response_logprobs)
        assert set(trace.loss_mask) <= {0, 1}
        token_versions = trace.token_versions()
        for token, mask, logprob, version in zip(
            trace.response_ids, trace.loss_mask, trace.response_logprobs, token_versions, strict=True
        ):
            if logprob == PLACEHOLDER_LOGPROB:  # an inserted token: never trained, no version
                assert mask == 0 and version is None
                continue
            assert version == versions[logprob]
            if mask:
                trained[(token, logprob)] += 1
        sampled = [v for v in token_versions if v is not None]
        assert (trace.weight_version_min, trace.weight_version_max) == (
            (sampled[0], sampled[-1]) if sampled else (None, None)
        )
        assert all(isinstance(span, VersionRange) for span in trace.version_spans)
    assert trained == sampled_tokens(session)
    assert {i for trace in result.traces for i in trace.capture_ids} == ok_ids
    assert result.stats.ok_captures == len(ok_ids)
    ambiguous = ambiguous_retries(session.captures, session.full_prompts)
    dead = dead_retries(session.captures, session.full_prompts) - ambiguous  # an ambiguous member counts as such
    dead_tokens = sum(len(r.output_ids) for r in session.captures if r.id in dead)
    ambiguous_tokens = sum(len(r.output_ids) for r in session.captures if r.id in ambiguous)
    untrained = dead_tokens + ambiguous_tokens
    assert result.stats.loss_tokens == result.stats.sampled_tokens - untrained == sum(trained.values())
    assert result.stats.untrained_tokens.get("dead_branch", 0) == dead_tokens
    assert result.stats.untrained_tokens.get("ambiguous_witness", 0) == ambiguous_tokens
    assert [trace.chain_index for trace in result.traces] == list(range(len(result.traces)))


def check_prefix_merge(session: SyntheticSession, result: BuildResult, tokenizer: ChatTokenizer) -> None:
    """prefix_merge: chains follow tree edges, and each trace reproduces its leaf's conversation: token for
    token when every merge was exact, and as text when a reply was re-rendered (same text, other ids)."""
    check_common(session, result)
    by_id = {record.id: record for record in session.captures}
    stats = result.stats
    branches = stats.break_causes.get("branch", 0)
    assert stats.ok_captures == stats.roots + stats.breaks - branches + stats.merges
    # Every split is counted with its cause: no trace appears without a root or a break behind it.
    assert stats.traces_out == len(result.traces) == stats.roots + stats.breaks
    for trace in result.traces:
        for parent_id, child_id in itertools.pairwise(trace.capture_ids):
            ancestor = by_id[child_id].parent_id
            while ancestor is not None and not by_id[ancestor].ok:  # merges step over failed calls
                ancestor = by_id[ancestor].parent_id
            assert ancestor == parent_id
        leaf = trace.capture_ids[-1]
        truth = session.full_prompts[leaf] + by_id[leaf].output_ids
        merged = trace.prompt_ids + trace.response_ids
        assert trace.prompt_ids == session.full_prompts[trace.capture_ids[0]]
        if trace.n_inexact_merges == 0:
            assert merged == truth
        assert tokenizer.decode(merged) == tokenizer.decode(truth)
    # Each live capture's tokens are trained in the first chain through it (depth first, children by seq), but
    # those of the chain the harness kept in the first trace through the session's terminal call.
    dead = untrained_retries(session.captures, session.full_prompts)
    kept_index, kept = terminal_chain(session.captures, dead, result.traces)
    first_chain: dict[int, int | None] = dict.fromkeys(kept, kept_index)
    for trace in result.traces:
        for capture_id in trace.capture_ids:
            first_chain.setdefault(capture_id, trace.chain_index)
    for trace in result.traces:
        owned = {i for i in trace.capture_ids if first_chain[i] == trace.chain_index and i not in dead}
        assert trace.n_loss_tokens == sum(len(by_id[i].output_ids) for i in owned)


def check_per_request(session: SyntheticSession, result: BuildResult) -> None:
    """per_request: the traces are the OK captures, one each, as sampled."""
    check_common(session, result)
    ok = [record for record in session.captures if record.ok]
    dead = untrained_retries(session.captures, session.full_prompts)
    assert len(result.traces) == len(ok) == result.stats.roots + result.stats.breaks
    for trace, record in zip(result.traces, ok, strict=True):
        assert trace.capture_ids == (record.id,)
        assert trace.prompt_ids == session.full_prompts[record.id]
        assert trace.response_ids == record.output_ids
        assert trace.response_logprobs == record.output_logprobs
        assert trace.loss_mask == (0 if record.id in dead else 1,) * len(record.output_ids)
        assert trace.finish_reason == record.finish_reason
        assert trace.n_malformed_tool_calls == record.n_malformed_tool_calls
