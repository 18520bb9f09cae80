"""Where every sampled token of the real CLIs' sessions goes: trained, or not trained and why (the token record).

Per harness of the e2e tier (the tool loops of tests/e2e/harnesses.py and the multi-agent scenarios of
tests/e2e/multiagent.py), the share of the sampled tokens that ``prefix_merge`` trains under the default builder
options (main and sub_agent roles train), and the share masked for each reason: ``dead_branch`` (a retry the
harness did not continue), ``poisoned`` (a chain from an unresolved call on), ``ambiguous_witness``,
``unacknowledged`` (a reply its caller never got), the role filter's ``role_not_trained``, and ``last_call_*`` (a
session whose last main call has no clean answer trains nothing). Shares add up to
100% per row. The e2e runs use the scripted policy, whose captures a rollout never trains; the record is computed
as if they were sampled (the builders' decisions do not depend on that).

    .venv/bin/python -m benchmarks.bench_token_record [--harnesses codex,claude,...] [--runs-dir DIR]
    .venv/bin/python -m benchmarks.bench_token_record --from-runs DIR   # read the result.json files under DIR,
        # e.g. pytest tests/e2e --basetemp DIR

Needs scripts/install_harnesses.sh (or runs already recorded).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages

from benchmarks.bench_harness_merge import ALL, add_selection_args, load_session, record_selected
from db.enums import RolloutStatus
from polar.trajectory.choices import BuilderOptions, select_roles
from polar.trajectory.prefix_merge import prefix_merge
from polar.trajectory.training_filter import apply_training_filter

TRAINED = "trained"


def token_record(name: str, result: dict) -> Counter[str]:
    """Sampled tokens of one recorded session by fate: ``trained`` or the reason they are not."""
    records, roles = load_session(name, result)
    merged = prefix_merge(records, roles=roles)
    out: Counter[str] = Counter(merged.stats.untrained_tokens or {})
    before = {t.chain_index: t.n_loss_tokens for t in merged.traces}
    # As a COMPLETED rollout trains: a session whose last main call has no clean answer trains nothing.
    filtered = apply_training_filter(merged.traces, status=RolloutStatus.COMPLETED, unfinished=merged.stats.unfinished)
    for trace in select_roles(filtered, BuilderOptions().train_roles):
        out[TRAINED] += trace.n_loss_tokens
        lost = before[trace.chain_index] - trace.n_loss_tokens
        if lost:
            out[trace.filter_reason or "filtered"] += lost
    return out


def _results(root: Path) -> list[tuple[str, dict]]:
    found = []
    for path in sorted(root.rglob("result.json")):
        result = json.loads(path.read_text())
        if "session_id" in result and "database_url" in result:
            found.append((path.parent.name if path.parent.name in ALL else result.get("harness", "?"), result))
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    add_selection_args(parser)
    parser.add_argument("--from-runs", type=Path, default=None, help="read result.json files under this folder")
    args = parser.parse_args()
    if args.from_runs is not None:
        runs = _results(args.from_runs)
    else:
        where, runs = record_selected(args, "polar-token-record-")
        print(f"sessions recorded under {where}")
    rows = [(name, token_record(name, result)) for name, result in runs]
    reasons = sorted({k for _, r in rows for k in r if k != TRAINED})
    print(f"{'harness':<24} {'sampled':>8} {'trained':>8} " + " ".join(f"{k:>17}" for k in reasons))
    total: Counter[str] = Counter()
    for name, fate in rows:
        total.update(fate)
        _row(name, fate, reasons)
    _row("all", total, reasons)


def _row(name: str, fate: Counter[str], reasons: list[str]) -> None:
    sampled = sum(fate.values())
    share = lambda n: f"{n / sampled:.1%}" if sampled else "-"  # noqa: E731
    cells = " ".join(f"{share(fate[k]):>17}" for k in reasons)
    print(f"{name:<24} {sampled:>8} {share(fate[TRAINED]):>8} {cells}")


if __name__ == "__main__":
    main()
