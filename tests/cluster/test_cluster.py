"""A cluster in network namespaces: a database host (a Postgres started here, holding the store and Prefect's
database, and the Prefect server), two inference hosts (``polar serve-model``), two worker hosts (each a Prefect
worker and a gateway replica), and a load-balancer host (HAProxy, deploy/haproxy.cfg).

One batch of 48 rollouts of the built-in tool-using agent runs over both worker hosts (two halves of it, one
batch flow run per worker) and both gateway replicas (HAProxy balances round-robin here, so the calls of one
session hit either replica: replicas must not need affinity). Scripted sessions decide what the agent does (their
reward is known) in four calls each, which alternate between the replicas; each such session still merges into
one trajectory. Model sessions sample from the tiny model through the inference fleet (POLAR_BACKEND_URL lists
both servers). Mid-batch one inference server is killed (kill -9): its sessions move to the other, and every
rollout still finishes. Then one worker host loses every process (worker, flow process, harnesses, gateway):
the retry flow, on the other host, resumes its rollouts at the stage that failed (the runtime root is on storage
both hosts share, as an NFS mount would be); a harness cut short mid-run is launched again there, so every
rollout ends COMPLETED with its reward, and the cut-short launch's captures are kept (INTERRUPTED) and in no
trajectory. The stage limits are the default fleet-wide ones (Prefect global concurrency limits): the slots the
killed host held come back once their leases (``POLAR_LIMIT_LEASE_S``, 60 s) run out, and the peak of each
stage over the fleet is recorded and checked against its limit.

The cluster itself (tests/cluster/fleet.py) is started by PID and stopped by PID; the namespaces are deleted at
the end, even on failure."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections import Counter, defaultdict
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from db.capture_tree import full_prompt_ids
from db.enums import CaptureStatus, RolloutStatus
from db.models import Capture, Rollout, Task, Trajectory
from polar.backends.fleet import FleetBackend, Member
from polar.inference import GenerateRequest
from polar.proxy.session.sessions import hash_key
from tests.cluster.fleet import LIMITS, STALE_AFTER_S, Cluster, cluster  # noqa: F401
from tests.cluster.hosts import missing_tools, wait_for
from tests.rollout.helpers import GIT_INIT, bash

# CI installs what the test needs (make tools): there a missing tool is a failure, not a skip.
pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(missing_tools() is not None and os.environ.get("CI") != "true", reason=str(missing_tools())),
]
PER_BATCH = {"solve": 8, "fail": 8, "model": 8}  # x2 batches = 48 rollouts
SCRIPTED_CALLS = 4


def tasks(tag: str) -> list[dict]:
    """Four calls of the agent per scripted session; one per model session (the tiny model calls no tool)."""
    steps = [bash("echo start > log.txt"), bash("cat log.txt")]
    solve = {"type": "scripted", "replies": [*steps, bash("echo polar > answer.txt"), {"content": "Done."}]}
    fail = {"type": "scripted", "replies": [*steps, bash("echo nope > answer.txt"), {"content": "Done."}]}
    base = {
        "instruction": "Write the word polar into answer.txt.",
        "harness": {"name": "agent", "config": {"max_turns": SCRIPTED_CALLS + 1}},
        "runtime": {"prepare": [{"command": GIT_INIT}]},
        "evaluator": {"type": "file", "config": {"path": "answer.txt", "equals": "polar"}},
    }
    # Short model replies: the tiny model's text is noise, and a CPU generates slowly.
    sampled = {**base, "harness": {"name": "agent", "config": {"max_turns": 4, "max_tokens": 8}}}
    return [
        {**sampled, "name": f"model-a-{tag}", "num_samples": PER_BATCH["model"] // 2},
        {**base, "name": f"solve-{tag}", "num_samples": PER_BATCH["solve"], "policies": [solve]},
        {**base, "name": f"fail-{tag}", "num_samples": PER_BATCH["fail"], "policies": [fail]},
        {**sampled, "name": f"model-b-{tag}", "num_samples": PER_BATCH["model"] // 2},
    ]


def expected_reward(task_name: str) -> float:
    return 1.0 if task_name.startswith("solve-") else 0.0  # the tiny model writes no file: the evaluator says 0


def flow_run_id(output: str) -> str:
    found = re.search(r"UUID:\s*([0-9a-f-]{36})", output)
    assert found, output
    return found.group(1)


def ranked_first(session: str, urls: list[str]) -> str:
    fleet = FleetBackend([Member(u) for u in urls], connect=None)  # type: ignore[arg-type]  # ranking only
    return fleet.ranking(GenerateRequest((), session_id=session))[0].url


def peak(intervals: list[tuple[datetime, datetime]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    level = top = 0
    for _, step in events:
        level += step
        top = max(top, level)
    return top


def test_a_batch_over_two_worker_hosts_survives_an_inference_server_and_a_worker_host(cluster: Cluster):
    net, store = cluster.net, cluster.engine
    started = time.monotonic()
    phases: dict[str, float] = {}

    def phase(name: str) -> None:
        phases[name] = round(time.monotonic() - started, 1)
        print(f"cluster test: {name} at {phases[name]} s", file=sys.stderr, flush=True)

    names = {"a": tasks("a"), "b": tasks("b")}
    runs = {}
    for half in ("a", "b"):
        out = cluster.prefect(
            "deployment", "run", "polar-batch/batch", "--param", f"tasks={json.dumps(names[half])}",
            "--param", "dispatch=inline",
        )  # fmt: skip
        runs[half] = flow_run_id(out)  # each worker takes one flow run at a time (--limit 1): one half each

    def rows() -> list[tuple[Rollout, str]]:
        with Session(store) as db:
            found = db.execute(sa.select(Rollout, Task.name).join(Task, Rollout.task_id == Task.id)).all()
            return [(row, name) for row, name in found]

    def statuses() -> Counter:
        with store.connect() as conn:
            return Counter(conn.execute(sa.select(Rollout.status)).scalars())

    def captures_on(url: str) -> int:
        with store.connect() as conn:
            return conn.execute(sa.select(sa.func.count()).where(Capture.server == url)).scalar_one()

    for half in ("a", "b"):
        wait_for(lambda h=half: cluster.flow_run_state(runs[h]) == "RUNNING", 120, f"half {half} to start")
    # Both halves run at once, one per worker host (each worker takes one flow run at a time).
    inf1, inf2 = cluster.inference["inf1"], cluster.inference["inf2"]
    wait_for(lambda: captures_on(inf1) >= 2, 240, "model calls on the first inference server")
    net.kill_host("inf1")
    phase("inference server killed")
    inference_killed_at = datetime.now().astimezone()

    wait_for(lambda: statuses()[RolloutStatus.COMPLETED] >= 20, 300, "a good part of the batch")
    killed = net.kill_host("w1")  # the worker, its flow process, its harnesses, its gateway replica
    assert killed
    host_killed_at = datetime.now().astimezone()
    phase("worker host killed")

    # The other host's half finishes; the dead host's flow run never will.
    wait_for(
        lambda: "COMPLETED" in {cluster.flow_run_state(runs["a"]), cluster.flow_run_state(runs["b"])},
        400,
        "the surviving host's half",
        every_s=2,
    )
    phase("surviving half done")
    stuck = [r for r, _ in rows() if not RolloutStatus(r.status).is_terminal]
    silent_s = (datetime.now().astimezone() - host_killed_at).total_seconds()
    time.sleep(max(0.0, STALE_AFTER_S + 1 - silent_s))
    out = cluster.prefect(
        "deployment", "run", "polar-retry-failed/retry-failed", "--param", "stale_after_s=3",
        "--param", "dispatch=inline", "--watch", "--watch-timeout", "300", host="w2", timeout_s=330,
    )  # fmt: skip
    assert "Completed" in out or "COMPLETED" in out, out
    elapsed = time.monotonic() - started
    phase("retry done")

    all_rows = rows()
    assert len(all_rows) == 2 * sum(PER_BATCH.values())
    relaunched: dict[str, dict] = {}
    for row, task_name in all_rows:
        # Every rollout finished with its evaluator's reward, those whose harness died with the host included.
        assert row.status is RolloutStatus.COMPLETED, (task_name, row.status, row.error)
        assert row.reward == expected_reward(task_name), (task_name, row.reward)
        again = ((row.stage_results or {}).get("run") or {}).get("relaunched")
        if again:  # its harness died with the host mid-run: launched again on the other host, by the retry
            assert row.id in {r.id for r in stuck}, row.id
            relaunched[row.id] = again
    assert len(relaunched) <= LIMITS["run"]  # at most the harnesses the killed host was running

    with Session(store) as db:
        captures = list(db.scalars(sa.select(Capture).order_by(Capture.rollout_id, Capture.seq)))
        trained: dict[str, list[list[int]]] = defaultdict(list)
        kept: dict[str, list[list[int]]] = defaultdict(list)
        chains = sa.select(Trajectory.rollout_id, Trajectory.capture_ids, Trajectory.kept)
        for rollout_id, capture_ids, is_kept in db.execute(chains):
            trained[rollout_id].append(list(capture_ids))
            if is_kept:
                kept[rollout_id].append(list(capture_ids))
        by_rollout: dict[str, list[Capture]] = defaultdict(list)
        for capture in captures:
            by_rollout[capture.rollout_id].append(capture)
        ids = {c.id: c for c in captures}
        for rollout_id, chain in by_rollout.items():
            assert [c.seq for c in chain] == list(range(len(chain))), rollout_id  # none lost, none twice
            set_aside = relaunched.get(rollout_id, {}).get("seq_end", 0)
            for capture in chain:
                assert capture.parent_id is None or ids[capture.parent_id].rollout_id == rollout_id
                # The cut-short launch's calls are set aside, the new launch's are its own (none extends an old one).
                assert (capture.status is CaptureStatus.INTERRUPTED) == (capture.seq < set_aside), capture.id
                if capture.parent_id is not None and capture.seq >= set_aside:
                    assert ids[capture.parent_id].seq >= set_aside, capture.id
                if capture.status is CaptureStatus.OK:
                    assert len(full_prompt_ids(db, capture)) == capture.n_prompt  # the chain rebuilds the prompt
            ok = {c.id for c in chain if c.status is CaptureStatus.OK}
            assert {i for t in trained[rollout_id] for i in t} <= ok, rollout_id  # set-aside calls never train
    task_of = {row.id: name for row, name in all_rows}
    model_calls = [c for c in captures if task_of[c.rollout_id].startswith("model") and c.status is CaptureStatus.OK]
    scripted_calls = [c for c in captures if not task_of[c.rollout_id].startswith("model")]
    assert all(c.server is None and c.scripted for c in scripted_calls)  # answered in the gateway, not sampled
    urls = [inf1, inf2]
    before = [c for c in model_calls if c.created_at < inference_killed_at]
    after = [c for c in model_calls if c.created_at > inference_killed_at + timedelta(seconds=1)]
    # Every gateway replica sends a session to the server it ranks first, until that server dies...
    assert before and all(c.server == ranked_first(c.rollout_id, urls) for c in before)
    # ...then the sessions that ranked it first move to the other one.
    assert after and all(c.server == inf2 for c in after)
    assert any(ranked_first(c.rollout_id, urls) == inf1 for c in after)

    # The calls of a session went through both gateway replicas (HAProxy's log: server, status, session key, in
    # order), and a scripted session whose calls alternated still merged into one trajectory of all its calls.
    # A call cut short by the killed host's replica (gateway-1, on w1) is answered 502 by HAProxy, and the
    # harness's SDK sends it again: only the answered calls are the session's calls.
    calls_of_key: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for line in cluster.lb_log.read_text().splitlines():
        parts = line.split(maxsplit=3)
        if len(parts) == 4 and parts[0] == "POLAR" and parts[3].startswith("Bearer "):
            calls_of_key[hash_key(parts[3].removeprefix("Bearer "))].append((parts[1], int(parts[2])))
    switching = cut_short_rows = 0
    scripted = [row for row, name in all_rows if not name.startswith("model") and row.id not in relaunched]
    for row in scripted:
        logged = calls_of_key[row.session_token_hash or ""]
        served = [server for server, status in logged if status < 500]
        assert all(server == "gateway-1" for server, status in logged if status >= 500), (row.id, logged)
        assert len(served) == SCRIPTED_CALLS, (row.id, logged)
        calls = [c.id for c in by_rollout[row.id] if c.status is CaptureStatus.OK]
        if len(served) < len(logged):
            # The cut-short call's capture, where its replica committed it before dying, is a sibling of the call
            # sent again; the chain the harness kept holds one capture per answered call.
            cut_short_rows += 1
            assert len(calls) <= len(logged), (row.id, logged, calls)
            assert len(kept[row.id]) == 1 and len(kept[row.id][0]) == SCRIPTED_CALLS, (row.id, kept[row.id], calls)
            assert set(kept[row.id][0]) <= set(calls), (row.id, kept[row.id], calls)
            continue
        if len(set(served)) < 2:
            continue
        switching += 1
        assert trained[row.id] == [calls], (row.id, served, trained[row.id], calls)
    # HAProxy's round robin spreads consecutive calls of a session over both replicas in about half the sessions.
    assert switching >= max(1, len(scripted) // 4), (switching, len(scripted))

    # The fleet-wide limits held: the peak of each stage over every host (intervals as recorded in the rows).
    peaks = {}
    for stage, limit in LIMITS.items():
        spans = []
        for row, _ in all_rows:
            timing = (row.stage_timings or {}).get(stage) or {}
            if timing.get("started_at") and timing.get("finished_at"):
                spans.append(
                    (datetime.fromisoformat(timing["started_at"]), datetime.fromisoformat(timing["finished_at"]))
                )
        peaks[stage] = peak(spans)
        assert peaks[stage] <= limit, (stage, peaks[stage], limit)
    print(
        f"\ncluster: {len(all_rows)} rollouts in {elapsed:.0f} s; inference server killed after {len(before)} model "
        f"calls, {len(after)} after; worker host killed at {host_killed_at:%H:%M:%S} ({len(killed)} processes), "
        f"{len(stuck)} resumed by the retry flow, {len(relaunched)} harnesses launched again; "
        f"fleet-wide peaks {peaks} (limits {LIMITS}); "
        f"scripted sessions over both replicas {switching}/{len(scripted)} ({SCRIPTED_CALLS} calls each), "
        f"{cut_short_rows} with a call cut short by the killed replica; "
        f"phases {phases}"
    )
