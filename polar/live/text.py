"""The live snapshot as terminal text (``polar status``): one screen, gateways, stages, throughput, versions,
alarms."""

from __future__ import annotations

from polar.live.view import LiveSnapshot


def _num(value: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def _backends(values: dict[str, float]) -> str:
    return ",".join(f"{k}={v:g}" for k, v in sorted(values.items())) or "-"


def format_live(snap: LiveSnapshot) -> str:
    fleet = snap.fleet
    lines = [f"fleet at {fleet.at:%Y-%m-%d %H:%M:%S} UTC", "", "gateways:"]
    if not snap.gateways:
        lines.append("  (none registered)")
    for g in snap.gateways:
        load = g.load
        lines.append(
            f"  {g.state.value:<8} {g.entry.id:<24} heartbeat {g.entry.silent_s:5.1f}s ago"
            + (
                f"  in-flight {_backends(load.in_flight)}  queued {_backends(load.queued)}"
                f"  calls/s {_num(load.calls_per_s)}  errors {_num(load.error_rate, '{:.1%}')}"
                f"  loop lag {_num(None if load.loop_lag_s is None else load.loop_lag_s * 1e3)} ms"
                if load is not None
                else ""
            )
        )
    stages = "  ".join(
        f"{s.stage} {s.occupied}/{'-' if s.limit is None else s.limit}" for s in [fleet.ready, *fleet.stages]
    )
    lines += ["", f"stages:   pending {fleet.pending}  {stages}"]
    t = fleet.throughput
    causes = ", ".join(f"{cause} {n}" for cause, n in t.causes) or "none"
    lines.append(
        f"last {t.window_s / 60:g} min: {t.finished} finished ({t.per_minute:.1f}/min), "
        f"{t.failed} failed ({t.failed_per_minute:.1f}/min): {causes}"
    )
    v = fleet.versions
    lines.append(
        f"weights:  current {v.current or '-'} ({v.registered} registered); {v.collecting} rollouts collecting, "
        f"behind max {_num(v.behind_max, '{:d}')}, mean {_num(v.behind_mean)}"
    )
    lines += ["", f"alarms:   {len(snap.alarms) or 'none'}"]
    lines += [f"  ! {a.kind.value}: {a.message}" for a in snap.alarms]
    return "\n".join(lines)
