"""The trainer adapters' one chain per rollout (``polar.integrations.groups``, shared by TRL and verl) is the chain
the harness kept, found by witnesses (what it continued), never by token counts.

Property over random capture trees with turns, retries (of the first, a middle and the last call; some of them
after a lost, unacknowledged reply), branches and edited history: under ``prefix_merge`` each sampled id is trained
at most once; no dead retry and no poisoned call is ever trained; the adapters' sample is the chain through the
session's terminal call, and every id it trains is on a chain the harness continued or ended on."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from db.enums import CaptureStatus
from polar.integrations.groups import _sample
from polar.trajectory.prefix_merge import prefix_merge
from polar.trajectory.records import BuildResult, CaptureRecord, Trace
from tests.trajectory.traj_helpers import EOT, RecordTree, untrained_retries

SYSTEM = [1, 50, 51, EOT, 1, 60]
ROLLOUT = {"rollout_id": "r", "sample_index": 0, "status": "COMPLETED"}
EVENTS = ("turn", "turn", "turn", "retry", "lost_retry", "branch", "edit")


def _row(trace: Trace) -> dict[str, Any]:
    return {
        "id": trace.chain_index,
        "chain_index": trace.chain_index,
        "prompt_ids": list(trace.prompt_ids),
        "response_ids": list(trace.response_ids),
        "loss_mask": list(trace.loss_mask),
        "response_logprobs": list(trace.response_logprobs),
        "reward": 1.0,
        "filter_reason": None,
        "weight_version_min": None,
        "weight_version_max": None,
        "kept": trace.kept,
    }


def _session(data: st.DataObject) -> RecordTree:
    """A random session: the main line goes on from ``tip``; side calls branch off any earlier call."""
    tree = RecordTree()
    counter = iter(range(100, 10_000))
    tip = tree.add(SYSTEM, [next(counter), EOT])
    for event in data.draw(st.lists(st.sampled_from(EVENTS), max_size=12), label="events"):
        parent = tree.records[tip.parent_id - 1] if tip.parent_id else None
        prompt = tree.full_prompts[tip.id]
        if event == "turn":
            tip = tree.add([*tree.sequence(tip), next(counter)], [next(counter), EOT], tip)
        elif event in ("retry", "lost_retry"):  # the same prompt again; the retry is what the harness continues
            if event == "lost_retry" and not any(r.parent_id == tip.id for r in tree.records):
                tree.records.remove(tip)  # the first reply was never acknowledged: renumber it as lost
                lost = CaptureRecord(**{**tip.__dict__, "status": CaptureStatus.UNACKNOWLEDGED})
                tree.records.append(lost)
            tip = tree.add(prompt, [next(counter), next(counter), EOT], parent)
        elif event == "branch":  # a side call off an earlier call; the main line goes on from ``tip``
            base = data.draw(st.sampled_from([r for r in tree.records if r.ok]), label="branch base")
            tree.add([*tree.sequence(base), next(counter)], [next(counter), EOT], base)
        elif event == "edit":  # the harness edited history: served, unresolved, poisoned from here on
            tree.add([*tree.sequence(tip), next(counter)], [next(counter), EOT], tip, admission="unresolved")
    return tree


def _poisoned(records: list[CaptureRecord]) -> set[int]:
    out: set[int] = set()
    for record in sorted(records, key=lambda r: r.seq):
        if record.admission == "unresolved" or record.parent_id in out:
            out.add(record.id)
    return out


def _trained(result: BuildResult) -> Counter[float]:
    return Counter(lp for t in result.traces for lp, m in zip(t.response_logprobs, t.loss_mask, strict=True) if m)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_adapters_train_the_kept_chain_and_every_token_once(data) -> None:
    tree = _session(data)
    records = sorted(tree.records, key=lambda r: r.seq)
    by_id = {r.id: r for r in records}
    result = prefix_merge(records)
    dead = untrained_retries(records, tree.full_prompts)
    poisoned = _poisoned(records)
    # The call the session ended on: its last acknowledged call that is neither an untrained retry nor poisoned.
    ends = [r for r in records if r.ok and r.id not in dead | poisoned]
    owner = {lp: r for r in records if r.ok for lp in r.output_logprobs}

    trained = _trained(result)
    assert all(n == 1 for n in trained.values()), "a sampled id trained twice"
    assert not {owner[lp].id for lp in trained} & (dead | poisoned), "a dead or poisoned call trained"

    kept = [t for t in result.traces if t.kept]
    if not ends:  # every call masked: there is no chain the harness kept, and the adapters train nothing
        assert not kept and not _sample(ROLLOUT, [_row(t) for t in result.traces], {}, 0, None).trainable
        return
    truth = ends[-1]
    assert len(kept) == 1 and truth.id in kept[0].capture_ids  # the chain the harness ended on
    sample = _sample(ROLLOUT, [_row(t) for t in result.traces], {}, 0, None)
    assert sample.trainable and sample.completion_ids == list(kept[0].response_ids)
    ended_on = set(kept[0].capture_ids)
    for logprob, mask in zip(sample.logprobs, sample.loss_mask, strict=True):
        if mask:
            assert owner[logprob].id in ended_on
    # Every live call of the kept chain trains there: its shared prefix is owned by it, not by a dead branch.
    live_on_chain = [i for i in kept[0].capture_ids if i not in dead | poisoned]
    assert sum(sample.loss_mask) == sum(len(by_id[i].output_ids) for i in live_on_chain)


def test_a_final_call_retry_after_a_client_timeout_trains_the_retry_only() -> None:
    tree = RecordTree()
    root = tree.add(SYSTEM, [10, EOT])
    step = tree.add([*tree.sequence(root), 70], [20, EOT], root)
    last = [*tree.sequence(step), 71]
    # The client timed out before reading: a long reply nobody used, stored unacknowledged.
    lost = tree.add(last, [30, 31, 32, 33, EOT], step, status=CaptureStatus.UNACKNOWLEDGED)
    retry = tree.add(last, [40, EOT], step)

    result = prefix_merge(tree.records)
    sample = _sample(ROLLOUT, [_row(t) for t in result.traces], {}, 0, None)

    assert sample.trainable and sample.chains == 1
    trained = [lp for lp, m in zip(sample.logprobs, sample.loss_mask, strict=True) if m]
    assert trained == [*root.output_logprobs, *step.output_logprobs, *retry.output_logprobs]
    assert not set(lost.output_logprobs) & set(trained)


def test_a_retry_no_witness_singles_out_is_masked_in_the_adapters_sample() -> None:
    """Twins (same reply ids, other logprobs) the next call echoes alike: TRL's and verl's shared sample trains
    the rest of the kept chain once and neither twin (the build names the reason, ``ambiguous_witness``)."""
    tree = RecordTree()
    root = tree.add(SYSTEM, [10, EOT])
    step = [*tree.sequence(root), 70]
    first = tree.add(step, [20, EOT], root)
    second = tree.add(step, [20, EOT], root)
    after = tree.add([*tree.sequence(second), 71], [30, EOT], second)

    result = prefix_merge(tree.records)
    sample = _sample(ROLLOUT, [_row(t) for t in result.traces], {}, 0, None)

    trained = [lp for lp, m in zip(sample.logprobs, sample.loss_mask, strict=True) if m]
    assert sample.trainable and trained == [*root.output_logprobs, *after.output_logprobs]
    assert not set(first.output_logprobs + second.output_logprobs) & set(trained)
    assert result.stats.untrained_tokens == {"ambiguous_witness": 4}
