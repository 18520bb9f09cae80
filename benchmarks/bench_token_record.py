"""Where every sampled token of the real CLIs' sessions goes: trained, or not trained and why (the token record).

Per harness of the e2e tier (the tool loops of tests/e2e/harnesses.py and the multi-agent scenarios of
tests/e2e/multiagent.py), the share of the sampled tokens that ``prefix_merge`` trains under the default builder
options (main and sub_agent roles train), and the share masked for each reason: ``dead_branch`` (a retry the
harness did not continue), ``poisoned`` (a chain from an unresolved call on), ``ambiguous_witness``,
``unacknowledged`` (a reply its caller never got), and the role filter's ``role_not_trained``. Shares add up to
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
import tempfile
from collections import Counter
from pathlib import Path

from benchmarks.bench_harness_merge import ADAPTER_OF, ALL, MAIN, MULTIAGENT, record
from db import make_engine, make_session_factory, session_scope
from harness_adapters import ADAPTERS
from polar.settings import get_settings
from polar.trajectory import load_capture_records
from polar.trajectory.call_views import load_call_views
from polar.trajectory.choices import BuilderOptions, select_roles
from polar.trajectory.prefix_merge import prefix_merge
from polar.trajectory.roles import label_session

TRAINED = "trained"


def token_record(name: str, result: dict) -> Counter[str]:
    """Sampled tokens of one recorded session by fate: ``trained`` or the reason they are not."""
    engine = make_engine(result["database_url"])
    try:
        with session_scope(make_session_factory(engine)) as session:
            records = load_capture_records(session, result["session_id"])
            views = load_call_views(session, result["session_id"])
    finally:
        engine.dispose()
    cli = (ALL[name].tool or name) if name in ALL else name
    adapter = ADAPTERS.get(ADAPTER_OF.get(cli, cli))
    roles = label_session(records, views, adapter.role_hints if adapter is not None else None)
    merged = prefix_merge(records, roles=roles)
    out: Counter[str] = Counter(merged.stats.untrained_tokens or {})
    before = {t.chain_index: t.n_loss_tokens for t in merged.traces}
    for trace in select_roles(merged.traces, BuilderOptions().train_roles):
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
    parser.add_argument("--harnesses", default=",".join(MAIN))
    parser.add_argument("--runs-dir", type=Path, default=None)
    parser.add_argument("--from-runs", type=Path, default=None, help="read result.json files under this folder")
    parser.add_argument("--no-multiagent", action="store_true")
    args = parser.parse_args()
    if args.from_runs is not None:
        runs = _results(args.from_runs)
    else:
        names = [n for n in args.harnesses.split(",") if n]
        if not args.no_multiagent:
            names += [n for n in MULTIAGENT if n not in names]
        missing = [n for n in names if not ALL[n].installed]
        if missing:
            raise SystemExit(f"not installed: {missing}; run scripts/install_harnesses.sh")
        from polar.models.tiny import ensure_model_dir

        cache = get_settings().cache_dir
        ensure_model_dir("tiny-long", cache)
        where = args.runs_dir or Path(tempfile.mkdtemp(prefix="polar-token-record-"))
        runs = [(name, record(name, where, cache)) for name in names]
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
