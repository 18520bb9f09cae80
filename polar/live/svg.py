"""Line charts drawn by the server as inline SVG: no script, no external file, one element per chart.

``line_chart`` plots one line per series over shared categorical x labels (weight versions), with a y axis from
0 (or the data's minimum) to the data's maximum, a legend, and a ``<title>`` on every point (a browser shows it
on hover). Gaps (None) break a line. Every text is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

COLORS = ("#1d2330", "#2f6fdf", "#d9480f", "#2b8a3e", "#9c36b5", "#e8590c", "#0b7285", "#c2255c")
WIDTH, HEIGHT = 460, 240
LEFT, RIGHT, TOP, BOTTOM = 48, 12, 28, 58


def _ticks(low: float, high: float, n: int = 4) -> list[float]:
    if high <= low:
        high = low + 1.0
    raw = (high - low) / n
    step = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 2.5, 5, 10):
        if raw <= factor * step:
            step *= factor
            break
    start = math.floor(low / step) * step
    ticks = []
    value = start
    while value <= high + step * 1e-9:
        ticks.append(round(value, 10))
        value += step
    return ticks


def _fmt(value: float) -> str:
    if abs(value) >= 1000:
        return f"{value / 1000:.1f}k"
    return f"{value:.2f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))


def line_chart(
    title: str,
    x_labels: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    *,
    y_range: tuple[float, float] | None = None,
    css_class: str = "chart",
) -> str:
    """An ``<svg>`` element; ``series`` maps a name to one value (or None) per x label."""
    values = [v for ys in series.values() for v in ys if v is not None]
    parts = [
        f'<svg class="{escape(css_class)}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{escape(title)}">',
        f'<text x="{LEFT}" y="16" font-size="13" font-weight="600" fill="#1d2330">{escape(title)}</text>',
    ]
    if not values or not x_labels:
        parts.append(
            f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" fill="#888">no finished rollouts</text>'
        )
        return "".join(parts) + "</svg>"
    low, high = y_range if y_range is not None else (min(0.0, min(values)), max(values))
    ticks = _ticks(low, high)
    low, high = min(low, ticks[0]), max(high, ticks[-1])
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(i: int) -> float:
        return LEFT + (plot_w * (i + 0.5) / len(x_labels))

    def y(v: float) -> float:
        return TOP + plot_h * (1 - (v - low) / (high - low or 1.0))

    for tick in ticks:
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" stroke="#e3e6ec"/>'
            f'<text x="{LEFT - 6}" y="{y(tick) + 4:.1f}" font-size="10" text-anchor="end" fill="#555">'
            f"{_fmt(tick)}</text>"
        )
    every = max(1, math.ceil(len(x_labels) / 10))
    for i, label in enumerate(x_labels):
        if i % every == 0:
            short = label if len(label) <= 14 else label[:13] + "…"
            parts.append(
                f'<text x="{x(i):.1f}" y="{HEIGHT - BOTTOM + 14}" font-size="10" text-anchor="middle" fill="#555">'
                f"{escape(short)}</text>"
            )
    parts.append(
        f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{HEIGHT - BOTTOM}" stroke="#999"/>'
        f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{HEIGHT - BOTTOM}" y2="{HEIGHT - BOTTOM}" stroke="#999"/>'
    )
    legend_x = LEFT
    for n, (name, ys) in enumerate(series.items()):
        color = COLORS[n % len(COLORS)]
        runs: list[list[tuple[float, float]]] = [[]]
        for i, v in enumerate(ys):
            if v is None:
                runs.append([])
            else:
                runs[-1].append((x(i), y(v)))
        for run in runs:
            if len(run) > 1:
                points = " ".join(f"{px:.1f},{py:.1f}" for px, py in run)
                parts.append(
                    f'<polyline class="line" data-series="{escape(name)}" points="{points}" fill="none" '
                    f'stroke="{color}" stroke-width="{2.2 if n == 0 else 1.5}"/>'
                )
        for i, v in enumerate(ys):
            if v is not None:
                parts.append(
                    f'<circle class="point" data-series="{escape(name)}" data-x="{escape(x_labels[i])}" '
                    f'data-y="{v:.6g}" cx="{x(i):.1f}" cy="{y(v):.1f}" r="3" fill="{color}">'
                    f"<title>{escape(name)} · {escape(x_labels[i])}: {v:.4g}</title></circle>"
                )
        label = name if len(name) <= 18 else name[:17] + "…"
        if legend_x + 14 + 7 * len(label) < WIDTH:
            parts.append(
                f'<rect x="{legend_x}" y="{HEIGHT - 22}" width="10" height="10" fill="{color}"/>'
                f'<text x="{legend_x + 14}" y="{HEIGHT - 13}" font-size="10" fill="#333">{escape(label)}</text>'
            )
            legend_x += 24 + 6 * len(label)
    return "".join(parts) + "</svg>"
