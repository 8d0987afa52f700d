"""How `statequeue stats` draws its figures: plain text for pipes and files,
a rich bar chart and a sparkline on a terminal. Both take a ``Stats``."""

from __future__ import annotations

import time as clock
from typing import TYPE_CHECKING

from statequeue.cli.clock import local_time
from statequeue.cli.render import counted_ids, plural, shown
from statequeue.core.command_text import command_text
from statequeue.core.durations import format_duration
from statequeue.core.textsafe import cut

if TYPE_CHECKING:
    from statequeue.cli.stats_names import StatsNames
    from statequeue.stats.figures import Group, Stats
    from statequeue.stats.rates import LiveRate

SPARKS = "▁▂▃▄▅▆▇█"
PLAIN_ROWS = 12  # throughput rows in the plain table (buckets are merged to fit)
BAR_WIDTH = 40
SHOWN_GROUPS = 20  # reasons, runners, hosts listed in the text (--json has them all)


def _dur(seconds: float | None) -> str:
    return "-" if seconds is None else format_duration(seconds)


def _clock(epoch: float) -> str:
    return local_time(epoch, "%Y-%m-%d %H:%M")


def headline(s: Stats) -> str:
    scope = f" in the last {format_duration(s.since)}" if s.since is not None else ""
    c = s.counts
    # With no runner alive, what is still marked running was left by a dead
    # one: `status` calls those items interrupted, and so does this line.
    dead = s.runner_active is False
    counts = ", ".join(
        f"{c[k]} {'interrupted' if dead and k == 'running' else k}" for k in c if c[k]
    )
    return f"queue {s.queue}: {plural(s.attempts, 'finished attempt')}{scope} ({counts or 'empty'})"


def duration_lines(s: Stats) -> list[str]:
    d = s.durations
    if not d.count:
        return ["durations: no done item yet"]
    q = d.quantiles
    return [
        f"durations of {plural(d.count, 'done item')} "
        f"(p50/p90/p99 within {d.error:.0%}; count and max exact):",
        f"  p50 {_dur(q['p50'])}  p90 {_dur(q['p90'])}  p99 {_dur(q['p99'])}"
        f"  max {_dur(d.max)}  mean {_dur(d.mean)}",
    ]


def _edge(seconds: float) -> str:
    if 0 < seconds < 0.001:
        return f"{seconds * 1e6:.0f}us"
    return "0" if seconds == 0 else format_duration(seconds)


def histogram_rows(s: Stats) -> list[tuple[str, int]]:
    return [(f"{_edge(lo)} - {_edge(hi)}", n) for lo, hi, n in s.durations.histogram]


def rate_lines(s: Stats) -> list[str]:
    active = s.runner_active is not False
    line = rate_text(
        s.rate, s.rate_window, s.recent_finishes, s.left, paused=s.paused, active=active
    )
    return [line]


def rate_text(
    rate: float | None,
    window: float,
    finished: int,
    left: int,
    *,
    paused: bool = False,
    active: bool = True,
) -> str:
    """The rate and ETA line, for `stats` and `status --watch` alike: an ETA
    only while a runner is ``active`` (after a kill -9 nothing is finishing)."""
    per_min = 0.0 if rate is None else rate * 60
    line = f"rate: {per_min:.1f} items/min over the last {format_duration(window)}"
    line += f" ({finished} finished)"
    if paused and left:  # as `status` says: no new item starts until `resume`
        line += f"; ETA paused ({plural(left, 'item')} left)"
    elif not active and left:
        line += f"; no ETA: no runner is active ({plural(left, 'item')} left)"
    elif rate and left:
        line += f"; ETA {format_duration(left / rate)} for {plural(left, 'item')} left"
    elif left:
        line += f"; ETA unknown ({plural(left, 'item')} left, none finished in the window)"
    return line


def watch_lines(
    live: LiveRate, left: int, *, paused: bool = False, active: bool = True
) -> list[str]:
    """What `status --watch` adds on each refresh (brought up to date first)."""
    live.update()
    now = clock.time()
    count = live.recent.count(now)
    rate = live.rate(now)
    return [rate_text(rate, live.recent.span(now), count, left, paused=paused, active=active)]


def _item(item_id: int, names: StatsNames | None) -> str:
    """``#7 report.pdf``: an item by its text, its id beside it."""
    text = names.items.get(item_id) if names is not None else None
    return f"#{item_id}" if text is None else f"#{item_id} {shown(text, 50)}"


def failure_lines(s: Stats, names: StatsNames | None = None) -> list[str]:
    lines = [
        f"failures: {plural(s.failed_attempts, 'failed attempt')}; "
        f"{plural(s.retried_items, 'item')} ran a 2nd attempt or later; "
        f"held: {counted_ids(s.held) if s.held else 'none'}"
    ]
    if s.deferred:
        lines.append(f"deferred: {plural(s.deferred, 'attempt')} asked to be tried later")
    top = s.reasons[:SHOWN_GROUPS]  # the most frequent first; --json has them all
    width = max((len(shown(g.reason, 80)) for g in top), default=0)
    for g in top:
        example = f"e.g. {_item(g.example_id, names)} (attempt {g.example_attempt})"
        lines.append(f"  {shown(g.reason, 80):<{width}}  {g.count:>8}  {example}")
    if len(s.reasons) > SHOWN_GROUPS:
        rest = sum(g.count for g in s.reasons[SHOWN_GROUPS:])
        more = len(s.reasons) - SHOWN_GROUPS
        lines.append(f"  ... and {plural(more, 'more reason')} ({rest} failed; all in --json)")
    return lines


def slowest_lines(s: Stats, names: StatsNames | None = None) -> list[str]:
    if not s.slowest:
        return []
    lines = [f"slowest {len(s.slowest)}:"]
    lines += [
        f"  {_dur(x.duration):>8}  {_item(x.item_id, names)}  (attempt {x.attempt})"
        for x in s.slowest
    ]
    return lines


def _runner(g: Group, names: StatsNames | None) -> str:
    """``4ec7417d on vm, started 2026-12-02 00:21:31: ./crawl {}``."""
    known = names.runners.get(g.name) if names is not None else None
    host = g.host or (known.host if known is not None else "") or "(unknown host)"
    text = f"{shown(g.name[:8]) or '(unnamed)'} on {shown(host)}"
    if known is not None and known.started_at is not None:
        text += f", started {local_time(known.started_at)}"
    if known is not None and known.command:
        text += f": {cut(command_text(known.command), 60)}"  # quoted, escaped: as typed
    return text


def group_lines(
    title: str, groups: tuple[Group, ...], *, runner: bool, names: StatsNames | None = None
) -> list[str]:
    if not groups:
        return []
    lines = [f"{title}:"]
    for g in groups[:SHOWN_GROUPS]:
        name = _runner(g, names) if runner else shown(g.name or "(unknown host)", 60)
        lines.append(
            f"  {name}  {plural(g.attempts, 'attempt')}, {g.failed} failed ({g.failure_rate:.1%})"
        )
    if len(groups) > SHOWN_GROUPS:
        lines.append(f"  ... and {len(groups) - SHOWN_GROUPS} more")
    return lines


def throughput_rows(s: Stats) -> list[tuple[str, float]]:
    """(bucket start, items per minute), merged to at most ``PLAIN_ROWS`` rows."""
    t = s.throughput
    if t.start is None:
        return []
    per = _rows_per(s)
    rows = []
    for i in range(0, len(t.counts), per):
        chunk = t.counts[i : i + per]
        minutes = len(chunk) * t.bucket_seconds / 60
        rows.append((_clock(t.start + i * t.bucket_seconds), sum(chunk) / minutes))
    return rows


def _rows_per(s: Stats) -> int:
    """Throughput buckets merged into one plain-text row."""
    return max(1, -(-len(s.throughput.counts) // PLAIN_ROWS))


def plain_text(s: Stats, names: StatsNames | None = None) -> str:
    if not s.attempts:
        return f"{headline(s)}\nno finished attempts yet: nothing to show"
    lines = [headline(s), *duration_lines(s)]
    rows = histogram_rows(s)
    if rows:
        width = max(len(r) for r, _ in rows)
        lines += ["  histogram:"] + [f"    {r:<{width}}  {n:>8}" for r, n in rows]
    width_s = format_duration(s.throughput.bucket_seconds * _rows_per(s))
    lines.append(f"throughput (items finished per minute; {width_s} rows):")
    lines += [f"  {when}  {per_min:>10.1f}" for when, per_min in throughput_rows(s)]
    lines += rate_lines(s) + failure_lines(s, names) + slowest_lines(s, names)
    lines += group_lines("runners", s.runners, runner=True, names=names)
    lines += group_lines("hosts", s.hosts, runner=False)
    return "\n".join(lines)


def sparkline(values: list[float]) -> str:
    top = max(values, default=0)
    if top <= 0:
        return SPARKS[0] * len(values)
    return "".join(SPARKS[min(int(v / top * (len(SPARKS) - 1) + 0.5), 7)] for v in values)


def print_rich(s: Stats, names: StatsNames | None = None) -> None:
    """The same figures on a terminal: a bar chart and a sparkline."""
    # lazy: start-up time (rich, only on a terminal)
    from rich.console import Console
    from rich.table import Table

    console = Console()
    out = console.print
    if not s.attempts:
        out(plain_text(s, names), markup=False, highlight=False)
        return
    out(headline(s), markup=False, highlight=False, style="bold")
    for line in duration_lines(s):
        out(line, markup=False, highlight=False)
    rows = histogram_rows(s)
    top = max((n for _, n in rows), default=0) or 1
    chart = Table(show_header=False, box=None, padding=(0, 1))
    for label, n in rows:
        chart.add_row("  " + label, "[cyan]" + "█" * round(n / top * BAR_WIDTH) + "[/]", str(n))
    out(chart)
    t = s.throughput
    if t.start is not None:
        spark = sparkline(t.per_minute())
        top_rate = max(t.per_minute(), default=0)
        out(f"throughput since {_clock(t.start)} (peak {top_rate:.1f}/min):", highlight=False)
        out("  " + spark, style="green", markup=False)
    for line in rate_lines(s) + failure_lines(s, names) + slowest_lines(s, names):
        out(line, markup=False, highlight=False)
    for line in group_lines("runners", s.runners, runner=True, names=names):
        out(line, markup=False, highlight=False)
    for line in group_lines("hosts", s.hosts, runner=False):
        out(line, markup=False, highlight=False)
