"""Inline SVG charts for the HTML report, generated in Python (no JavaScript, no network).

Three chart kinds cover the report: vertical stacked bars (time per step), horizontal bars
(per-worker utilisation, per-transform cost) and vertical bars with whiskers (throughput per
autotune trial with its spread). Every string that reaches the markup is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

FONT = "font-family:system-ui,sans-serif;font-size:11px;fill:#333"


@dataclass(frozen=True)
class Series:
    """One stacked layer: its legend label, fill colour and one value per bar."""

    label: str
    color: str
    values: tuple[float, ...]


def nice_ticks(max_value: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``max_value`` (1-2-5 steps)."""
    if not math.isfinite(max_value) or max_value <= 0:
        return [0.0, 1.0]
    raw = max_value / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    n = math.ceil(max_value / step - 1e-9)
    return [round(i * step, 12) for i in range(n + 1)]


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}".rstrip("0").rstrip(".")
    return f"{v:.3g}"


def _text(x: float, y: float, s: str, anchor: str = "start", extra: str = "") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" style="{FONT}"{extra}>'
            f"{escape(str(s))}</text>")


def _legend(items: Sequence[tuple[str, str]], x: float, y: float) -> str:
    out, cx = [], x
    for label, color in items:
        out.append(f'<rect x="{cx:.1f}" y="{y - 9:.1f}" width="10" height="10" fill="{escape(color)}"/>')
        out.append(_text(cx + 14, y, label))
        cx += 24 + 7 * len(label)
    return "".join(out)


def _svg(width: int, height: int, body: str, title: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">'
            f"<title>{escape(title)}</title>{body}</svg>")


def _y_axis(ticks: list[float], x0: float, x1: float, y_of, unit: str) -> str:
    out = []
    for t in ticks:
        y = y_of(t)
        out.append(f'<line x1="{x0:.1f}" y1="{y:.1f}" x2="{x1:.1f}" y2="{y:.1f}" stroke="#e3e3e3"/>')
        out.append(_text(x0 - 4, y + 4, _fmt(t), "end"))
    out.append(_text(x0 - 4, y_of(ticks[-1]) - 10, unit, "end"))
    return "".join(out)


def stacked_bars(series: Sequence[Series], x_labels: Sequence[str], title: str, unit: str,
                 width: int = 900, height: int = 280) -> str:
    """Vertical stacked bars, one per x label, one layer per series (e.g. data wait / H2D / compute)."""
    n = len(x_labels)
    if n == 0 or any(len(s.values) != n for s in series):
        raise ValueError(f"stacked_bars needs one value per label in every series (got {n} labels)")
    left, right, top, bottom = 56, 12, 30, 34
    totals = [sum(max(0.0, s.values[i]) for s in series) for i in range(n)]
    ticks = nice_ticks(max(totals) if totals else 0.0)
    plot_h = height - top - bottom
    scale = plot_h / ticks[-1]

    def y_of(v: float) -> float:
        return top + plot_h - v * scale

    slot = (width - left - right) / n
    bar_w = max(1.0, slot * 0.8)
    body = [_y_axis(ticks, left, width - right, y_of, unit)]
    label_every = max(1, math.ceil(n / 30))
    for i, label in enumerate(x_labels):
        x = left + i * slot + (slot - bar_w) / 2
        acc = 0.0
        for s in series:
            v = max(0.0, s.values[i])
            if v <= 0:
                continue
            y = y_of(acc + v)
            body.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{v * scale:.1f}" '
                        f'fill="{escape(s.color)}"><title>{escape(f"{label}: {s.label} {_fmt(v)} {unit}")}'
                        f"</title></rect>")
            acc += v
        if i % label_every == 0:
            body.append(_text(x + bar_w / 2, height - bottom + 14, label, "middle"))
    body.append(_legend([(s.label, s.color) for s in series], left, 16))
    return _svg(width, height, "".join(body), title)


def horizontal_bars(labels: Sequence[str], values: Sequence[float], title: str, unit: str,
                    colors: Sequence[str] | str = "#4c78a8", max_value: float | None = None,
                    width: int = 900) -> str:
    """One horizontal bar per label (e.g. CPU% per worker, ms per sample per transform)."""
    if len(labels) != len(values):
        raise ValueError(f"horizontal_bars got {len(labels)} labels and {len(values)} values")
    palette = [colors] * len(values) if isinstance(colors, str) else list(colors)
    row, top, left, right = 22, 10, min(260, 24 + 7 * max((len(str(s)) for s in labels), default=4)), 70
    height = top + row * max(1, len(labels)) + 24
    ticks = nice_ticks(max(max_value or 0.0, max(values, default=0.0)))
    scale = (width - left - right) / ticks[-1]
    body = []
    for t in ticks:
        x = left + t * scale
        body.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{height - 20}" stroke="#e3e3e3"/>')
        body.append(_text(x, height - 6, _fmt(t), "middle"))
    for i, (label, v) in enumerate(zip(labels, values)):
        y = top + i * row
        w = max(0.0, v) * scale
        color = palette[i % len(palette)]
        body.append(_text(left - 6, y + 15, label, "end"))
        body.append(f'<rect x="{left}" y="{y + 3}" width="{w:.1f}" height="{row - 6}" fill="{escape(color)}">'
                    f"<title>{escape(f'{label}: {_fmt(v)} {unit}')}</title></rect>")
        body.append(_text(left + w + 4, y + 15, f"{_fmt(v)} {unit}"))
    return _svg(width, height, "".join(body), title)


def whisker_bars(labels: Sequence[str], values: Sequence[float], lows: Sequence[float],
                 highs: Sequence[float], colors: Sequence[str], title: str, unit: str,
                 reference: tuple[str, float] | None = None, width: int = 900, height: int = 300) -> str:
    """Vertical bars with min..max whiskers (throughput per trial); ``reference`` draws a dashed line."""
    n = len(labels)
    if not (len(values) == len(lows) == len(highs) == len(colors) == n) or n == 0:
        raise ValueError("whisker_bars needs labels, values, lows, highs and colors of one non-zero length")
    left, right, top, bottom = 60, 12, 24, 40
    peak = max(list(highs) + list(values) + ([reference[1]] if reference else []))
    ticks = nice_ticks(peak)
    plot_h = height - top - bottom
    scale = plot_h / ticks[-1]

    def y_of(v: float) -> float:
        return top + plot_h - max(0.0, v) * scale

    slot = (width - left - right) / n
    bar_w = max(2.0, min(60.0, slot * 0.7))
    body = [_y_axis(ticks, left, width - right, y_of, unit)]
    for i, label in enumerate(labels):
        cx = left + i * slot + slot / 2
        v = max(0.0, values[i])
        body.append(f'<rect x="{cx - bar_w / 2:.1f}" y="{y_of(v):.1f}" width="{bar_w:.1f}" '
                    f'height="{v * scale:.1f}" fill="{escape(colors[i])}">'
                    f"<title>{escape(f'{label}: {_fmt(v)} {unit} (range {_fmt(lows[i])}..{_fmt(highs[i])})')}"
                    f"</title></rect>")
        if highs[i] > lows[i]:
            y_lo, y_hi = y_of(lows[i]), y_of(highs[i])
            body.append(f'<line x1="{cx:.1f}" y1="{y_lo:.1f}" x2="{cx:.1f}" y2="{y_hi:.1f}" stroke="#222" '
                        f'stroke-width="1.5"/>')
            for yy in (y_lo, y_hi):
                body.append(f'<line x1="{cx - 5:.1f}" y1="{yy:.1f}" x2="{cx + 5:.1f}" y2="{yy:.1f}" '
                            f'stroke="#222" stroke-width="1.5"/>')
        body.append(_text(cx, height - bottom + 14, label, "middle"))
    if reference is not None:
        y = y_of(reference[1])
        body.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" stroke="#555" '
                    f'stroke-dasharray="5,4"/>')
        body.append(_text(width - right, y - 4, f"{reference[0]} {_fmt(reference[1])}", "end"))
    return _svg(width, height, "".join(body), title)
