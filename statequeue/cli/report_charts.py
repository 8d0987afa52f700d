"""The report's charts as inline SVG strings, written by hand (no library,
nothing fetched): throughput over time, the timeline of attempts, and the
duration histogram. Colours come from CSS classes (``k0``..``k4``, one per
attempt kind) so that the page's dark-mode and print styles apply; every mark
carries its details in ``data-tip`` (the page's hover box) and a ``<title>``
(the browser's own tooltip, also without scripts)."""

from __future__ import annotations

import math
import time
from html import escape

from statequeue.core.textsafe import escaped
from statequeue.stats.report_model import (
    KIND_NAMES,
    DurationHistogram,
    Throughput,
    Timeline,
)

WIDTH = 960
LEFT = 130
RIGHT = 12
PLOT = WIDTH - LEFT - RIGHT


def clock(at: float) -> str:
    """A moment as local date and time, to the second."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def span(seconds: float) -> str:
    """A duration for people: 850ms, 12.3s, 4m05s, 2h03m, 3d04h."""
    if seconds == 0:
        return "0s"
    if seconds < 1:
        return f"{seconds * 1000:.3g}ms"
    if seconds < 60:
        return f"{seconds:.3g}s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def amount(value: float) -> str:
    """A count or rate for an axis: 950, 12.5k, 1.2M."""
    for size, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.3g}"


def _mark(tag: str, tip: str, **attrs: object) -> str:
    """An SVG element with its hover text (``data-tip`` and ``<title>``)."""
    fields = " ".join(f'{k.rstrip("_").replace("_", "-")}="{v}"' for k, v in attrs.items())
    text = escape(tip)
    return f'<{tag} {fields} data-tip="{text}"><title>{text}</title></{tag}>'


def _svg(height: int, body: list[str], label: str) -> str:
    return (
        f'<svg class="chart" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">'
        + "".join(body)
        + "</svg>"
    )


def _time_axis(start: float, seconds: float, y: int) -> list[str]:
    """Ticks along the x axis: elapsed time since ``start``."""
    out = [f'<line class="axis" x1="{LEFT}" y1="{y}" x2="{LEFT + PLOT}" y2="{y}"/>']
    for j in range(6):
        x = LEFT + PLOT * j / 5
        at = start + seconds * j / 5
        anchor = "start" if j == 0 else "end" if j == 5 else "middle"
        out.append(
            f'<text class="tick" x="{x:.1f}" y="{y + 14}" text-anchor="{anchor}">'
            f"+{span(seconds * j / 5)}<title>{clock(at)}</title></text>"
        )
    return out


def throughput_svg(t: Throughput | None) -> str:
    """Attempts ended per minute, stacked by kind, one bar per bucket."""
    if t is None or not t.counts or not t.counts[0]:
        return '<p class="empty">No attempt has finished yet.</p>'
    height, top, bottom = 240, 10, 200
    buckets = len(t.counts[0])
    totals = [sum(row[j] for row in t.counts) for j in range(buckets)]
    scale = 60.0 / t.bucket_seconds
    peak = max(totals) * scale or 1.0
    width = PLOT / buckets
    body = [
        f'<text class="tick" x="{LEFT - 6}" y="{top + 4}" text-anchor="end">{peak:.4g}/min</text>',
        f'<text class="tick" x="{LEFT - 6}" y="{bottom}" text-anchor="end">0</text>',
        f'<line class="grid" x1="{LEFT}" y1="{top}" x2="{LEFT + PLOT}" y2="{top}"/>',
    ]
    for j in range(buckets):
        base = float(bottom)
        at = t.start + j * t.bucket_seconds
        parts = [f"{KIND_NAMES[k]} {row[j]}" for k, row in enumerate(t.counts) if row[j]]
        for k, row in enumerate(t.counts):
            if not row[j]:
                continue
            h = row[j] * scale / peak * (bottom - top)
            base -= h
            tip = (
                f"{clock(at)} +{span(t.bucket_seconds)}: {amount(totals[j] * scale)}/min "
                f"({', '.join(parts)})"
            )
            body.append(
                _mark(
                    "rect",
                    tip,
                    class_=f"mark k{k}",
                    x=f"{LEFT + j * width:.2f}",
                    y=f"{base:.2f}",
                    width=f"{max(width - 0.5, 0.5):.2f}",
                    height=f"{h:.2f}",
                )
            )
    body += _time_axis(t.start, buckets * t.bucket_seconds, bottom)
    return _svg(height, body, "throughput over time")


def timeline_svg(t: Timeline, start: float | None, end: float | None) -> str:
    """One lane per runner slot, a bar per attempt from its start to its end."""
    if not t.bars or start is None or end is None:
        return '<p class="empty">No attempt has finished yet.</p>'
    lane_h = max(3, min(14, 600 // max(len(t.lanes), 1)))
    top = 6
    bottom = top + lane_h * len(t.lanes)
    seconds = max(end - start, 1e-3)
    body = []
    label_every = max(1, math.ceil(11 / lane_h))
    lanes = [escaped(name) for name in t.lanes]  # runner ids from records: no control raw
    for n, name in enumerate(lanes):
        if n % label_every == 0:
            y = top + n * lane_h + lane_h - 2
            body.append(
                f'<text class="tick lane" x="{LEFT - 6}" y="{y}" text-anchor="end">'
                f"{escape(name[:22])}</text>"
            )
    for b in t.bars:
        x = LEFT + (b.start - start) / seconds * PLOT
        w = max((b.end - b.start) / seconds * PLOT, 0.8)
        tip = (
            f"item {b.item_id} attempt {b.attempt}: {KIND_NAMES[b.kind]}, "
            f"{span(b.end - b.start)}, {clock(b.start)} to {clock(b.end)} on {lanes[b.lane]}"
        )
        if b.in_flight:
            tip = (
                f"item {b.item_id} attempt {b.attempt}: in flight when its runner died, "
                f"not recovered yet; started {clock(b.start)} on {lanes[b.lane]}; "
                "no end known: drawn to the time of this report"
            )
        body.append(
            _mark(
                "rect",
                tip,
                class_=f"mark k{b.kind}",
                x=f"{x:.2f}",
                y=top + b.lane * lane_h,
                width=f"{w:.2f}",
                height=max(lane_h - 1, 2),
            )
        )
    body += _time_axis(start, seconds, bottom + 2)
    return _svg(bottom + 22, body, "timeline of attempts")


def histogram_svg(h: DurationHistogram) -> str:
    """Durations on a log scale: done and unsuccessful attempts side by side,
    with p50, p90 and p99 of the done ones marked."""
    if not h.edges:
        return '<p class="empty">No attempt with a duration yet.</p>'
    height, top, bottom = 240, 18, 200
    bins = len(h.done)
    peak = max(max(h.done), max(h.failed), 1)
    width = PLOT / bins
    low, high = math.log10(h.edges[0]), math.log10(h.edges[-1])
    body = [
        f'<text class="tick" x="{LEFT - 6}" y="{top + 4}" text-anchor="end">{peak}</text>',
        f'<text class="tick" x="{LEFT - 6}" y="{bottom}" text-anchor="end">0</text>',
        f'<line class="axis" x1="{LEFT}" y1="{bottom}" x2="{LEFT + PLOT}" y2="{bottom}"/>',
    ]
    for j in range(bins):
        for series, counts, kind in ((0, h.done, 0), (1, h.failed, 1)):
            if not counts[j]:
                continue
            bar = counts[j] / peak * (bottom - top)
            name = "done" if kind == 0 else "not done"
            tip = f"{counts[j]} {name} in {span(h.edges[j])} to {span(h.edges[j + 1])}"
            body.append(
                _mark(
                    "rect",
                    tip,
                    class_=f"mark k{kind}",
                    x=f"{LEFT + j * width + series * width / 2:.2f}",
                    y=f"{bottom - bar:.2f}",
                    width=f"{max(width / 2 - 0.5, 0.5):.2f}",
                    height=f"{bar:.2f}",
                )
            )
    per_decade = round((len(h.edges) - 1) / (high - low))
    for j in range(0, len(h.edges), per_decade):  # a label at each power of ten
        x = LEFT + j * width
        body.append(
            f'<text class="tick" x="{x:.1f}" y="{bottom + 14}" text-anchor="middle">'
            f"{span(h.edges[j])}</text>"
        )
    for n, (name, value) in enumerate(h.quantiles.items()):
        if value is None or value <= 0:
            continue
        x = LEFT + (math.log10(value) - low) / (high - low) * PLOT
        x = min(max(x, LEFT), LEFT + PLOT)
        body.append(
            _mark(
                "line",
                f"{name} of done attempts: {span(value)}",
                class_="quantile",
                x1=f"{x:.1f}",
                y1=top - 4,
                x2=f"{x:.1f}",
                y2=bottom,
            )
        )
        right = x > LEFT + PLOT - 40  # near the right edge: the label goes left of its line
        body.append(
            f'<text class="tick" x="{x - 3 if right else x + 3:.1f}" y="{top - 6 + 10 * n}" '
            f'text-anchor="{"end" if right else "start"}">{name}</text>'
        )
    return _svg(height, body, "duration histogram")
