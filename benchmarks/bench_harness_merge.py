"""Prefix merging on sessions recorded from the real CLIs (issue: trajectories), one row per harness.

Each CLI runs its scripted tool loop through the gateway inside a network namespace (the e2e runner in
tests/e2e), recording captures in a SQLite store; then both builders run over each session:

    .venv/bin/python -m benchmarks.bench_harness_merge [--harnesses codex,claude,...] [--runs-dir DIR]

Columns: captures (OK model calls), per_request traces, merged traces, merge ratio (captures per merged
trace), conditioning-exact rate (merges where the sampled ids appear verbatim in the next prompt), breaks
and their causes, and which calls started new roots (title calls, routers); then, per harness and chain role
(main, sub_agent, compaction, title, other; labelled with the adapter's role hints), captures -> merged traces
and how many of those train under the default builder options; the multi-agent scenarios of
tests/e2e/multiagent.py (a Claude Code sub-agent, Codex and OpenCode compacting) run too unless
``--no-multiagent``. Then builder throughput on a 200-turn synthetic session. Needs scripts/install_harnesses.sh.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages

from benchmarks.bench_trajectories import throughput
from db import make_engine, make_session_factory, session_scope
from harness_adapters import ADAPTERS
from polar.settings import get_settings
from polar.trajectory import CaptureRecord, get_builder, load_capture_records
from polar.trajectory.call_views import load_call_views
from polar.trajectory.choices import BuilderOptions, select_roles
from polar.trajectory.roles import SessionRoles, label_session
from tests.e2e.harnesses import HARNESSES
from tests.e2e.multiagent import SCENARIOS
from tests.e2e.sandbox import isolation

MAIN = ("codex", "claude", "gemini", "qwen", "opencode", "pi")
MULTIAGENT = tuple(SCENARIOS)
# The adapter whose role hints label each CLI's sessions.
ADAPTER_OF = {
    "codex": "codex",
    "claude": "claude_code",
    "gemini": "gemini_cli",
    "qwen": "qwen_code",
    "opencode": "opencode",
}
ALL = {**HARNESSES, **SCENARIOS}


def record(name: str, runs: Path, cache: Path) -> dict:
    iso = isolation()
    if iso is None:
        raise SystemExit("no network namespace can be made here (unshare -n)")
    run_dir = runs / name
    args = ["--harness", name, "--run-dir", str(run_dir), "--cache", str(cache), "--timeout", "300"]
    started = time.monotonic()
    proc = subprocess.run(iso.command(args, run_dir), capture_output=True, text=True, timeout=420)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: runner failed ({proc.returncode}): {proc.stderr[-2000:]}")
    result = json.loads((run_dir / "result.json").read_text())
    result["wall_s"] = time.monotonic() - started
    return result


def load_session(name: str, result: dict) -> tuple[list[CaptureRecord], SessionRoles]:
    """The captures of one recorded session and their roles, labelled with the CLI's adapter hints (if any)."""
    engine = make_engine(result["database_url"])
    try:
        with session_scope(make_session_factory(engine)) as session:
            records = load_capture_records(session, result["session_id"])
            views = load_call_views(session, result["session_id"])
    finally:
        engine.dispose()
    cli = (ALL[name].tool or name) if name in ALL else name
    adapter = ADAPTERS.get(ADAPTER_OF.get(cli, cli))
    return records, label_session(records, views, adapter.role_hints if adapter is not None else None)


def add_selection_args(parser: argparse.ArgumentParser) -> None:
    """The harness-selection options shared by the benchmarks that record e2e sessions."""
    parser.add_argument("--harnesses", default=",".join(MAIN))
    parser.add_argument("--runs-dir", type=Path, default=None)
    parser.add_argument("--no-multiagent", action="store_true", help="skip the sub-agent and compaction scenarios")


def record_selected(args: argparse.Namespace, prefix: str) -> tuple[Path, list[tuple[str, dict]]]:
    """Run every selected harness (and the multi-agent scenarios) once; the runs folder and (name, result) pairs."""
    names = [n for n in args.harnesses.split(",") if n]
    if not args.no_multiagent:
        names += [n for n in MULTIAGENT if n not in names]
    missing = [n for n in names if not ALL[n].installed]
    if missing:
        raise SystemExit(f"not installed: {missing}; run scripts/install_harnesses.sh")
    from polar.models.tiny import ensure_model_dir

    cache = get_settings().cache_dir
    ensure_model_dir("tiny-long", cache)
    runs = args.runs_dir or Path(tempfile.mkdtemp(prefix=prefix))
    return runs, [(name, record(name, runs, cache)) for name in names]


def merge_row(name: str, result: dict) -> dict:
    records, roles = load_session(name, result)
    per_request = get_builder("per_request")(records, roles=roles)
    merged = get_builder("prefix_merge")(records, roles=roles)
    stats = merged.stats
    options = BuilderOptions()
    by_role: dict[str, list[int]] = {}
    captures_by_role = Counter(roles.label_of(r.id).role.value for r in records if r.ok)
    for trace in select_roles(merged.traces, options.train_roles):
        row = by_role.setdefault(trace.role, [captures_by_role[trace.role], 0, 0])
        row[1] += 1
        row[2] += trace.n_loss_tokens > 0
    merges = stats.exact_merges + stats.inexact_merges
    return {
        "harness": name,
        "captures": stats.ok_captures,
        "per_request": len(per_request.traces),
        "merged": len(merged.traces),
        "ratio": stats.ok_captures / max(len(merged.traces), 1),
        "exact": stats.exact_merges / merges if merges else float("nan"),
        "breaks": dict(stats.break_causes),
        "roots": stats.roots,
        "roles": by_role,
        "wall_s": result["wall_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    add_selection_args(parser)
    args = parser.parse_args()
    runs, recorded = record_selected(args, "polar-harness-merge-")
    rows = [merge_row(name, result) for name, result in recorded]
    print(f"sessions recorded under {runs}")
    print(
        f"{'harness':<18} {'captures':>8} {'per_request':>11} {'merged':>6} {'ratio':>6} {'exact':>6} {'roots':>5} "
        " breaks"
    )
    for r in rows:
        print(
            f"{r['harness']:<18} {r['captures']:>8} {r['per_request']:>11} {r['merged']:>6} {r['ratio']:>6.2f} "
            f"{r['exact']:>6.0%} {r['roots']:>5}  {r['breaks'] or '-'}"
        )
    captures, merged = sum(r["captures"] for r in rows), sum(r["merged"] for r in rows)
    print(
        f"{'total':<18} {captures:>8} {sum(r['per_request'] for r in rows):>11} {merged:>6} "
        f"{captures / max(merged, 1):>6.2f}"
    )
    print()
    print("per role (prefix_merge, default builder options: main and sub_agent train)")
    print(f"{'harness':<18} {'role':<11} {'captures':>8} {'traces':>6} {'trained':>7}")
    for r in rows:
        for role, (captures, traces, trainable) in sorted(r["roles"].items()):
            print(f"{r['harness']:<18} {role:<11} {captures:>8} {traces:>6} {trainable:>7}")
    print()
    throughput(200)


if __name__ == "__main__":
    main()
