"""The report as one self-contained HTML page: styles and the hover script
inline, charts as inline SVG (``report_charts``), no font, image or script
fetched, so that the file opens from disk on a laptop with no network and
travels as an attachment. Styles for a browser's dark mode
(prefers-color-scheme) and for print are part of the page."""

from __future__ import annotations

from collections.abc import Callable
from html import escape

from statequeue.cli.report_charts import clock, histogram_svg, span, throughput_svg, timeline_svg
from statequeue.core.textsafe import escaped
from statequeue.stats.report_model import (
    HELD,
    INTERRUPTED,
    KIND_NAMES,
    RETRIED,
    FailureGroup,
    ItemRow,
    Report,
)

STYLE = """
:root{--bg:#fff;--fg:#1d2430;--muted:#5c6675;--line:#d5dae1;--card:#f5f7fa;
--k0:#2f8f5b;--k1:#c8383b;--k2:#e09b2d;--k3:#7b52c7;--k4:#3a78c2;--q:#1d2430}
@media (prefers-color-scheme:dark){:root{--bg:#15191f;--fg:#e3e7ec;--muted:#9aa4b1;
--line:#39414c;--card:#1e242c;--k0:#4cbf7f;--k1:#ef6265;--k2:#f0b550;--k3:#a383e6;
--k4:#6aa5ea;--q:#e3e7ec}}
*{box-sizing:border-box}
body{margin:0 auto;max-width:1000px;padding:16px 20px 40px;background:var(--bg);
color:var(--fg);font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif}
h1{font-size:22px;margin:4px 0 2px}h2{font-size:17px;margin:26px 0 4px}
p.why{color:var(--muted);margin:0 0 8px}p.empty{color:var(--muted)}
dl.head{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:10px 0}
dl.head dt{color:var(--muted)}dl.head dd{margin:0}
.cards{display:flex;flex-wrap:wrap;gap:8px;margin:10px 0}
.card{background:var(--card);border:1px solid var(--line);border-radius:6px;padding:6px 12px}
.card b{display:block;font-size:18px}
svg.chart{width:100%;height:auto;display:block}
svg .tick{font-size:11px;fill:var(--muted)}svg .axis,svg .grid{stroke:var(--line)}
svg .quantile{stroke:var(--q);stroke-dasharray:4 3;stroke-width:1.5}
.k0{fill:var(--k0);background:var(--k0)}.k1{fill:var(--k1);background:var(--k1)}
.k2{fill:var(--k2);background:var(--k2)}.k3{fill:var(--k3);background:var(--k3)}
.k4{fill:var(--k4);background:var(--k4)}
svg .mark:hover{opacity:.7}
.legend{display:flex;gap:14px;color:var(--muted);font-size:12px;margin:2px 0 6px}
.legend i{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:4px}
table{border-collapse:collapse;width:100%;margin:4px 0}
th,td{text-align:left;padding:3px 8px;border-bottom:1px solid var(--line);vertical-align:top}
th{color:var(--muted);font-weight:600}td.n{text-align:right;white-space:nowrap}
td.item{word-break:break-all;font-family:ui-monospace,monospace;font-size:12px}
code{font-family:ui-monospace,monospace;font-size:12px}
#tip{position:fixed;pointer-events:none;display:none;max-width:420px;padding:5px 8px;
background:var(--fg);color:var(--bg);border-radius:4px;font-size:12px;z-index:9}
@media print{body{max-width:none;color:#000;background:#fff}#tip{display:none!important}
section{break-inside:avoid}a{color:#000}}
"""

REASONS = 50
"""Failure reasons listed, at most (the most frequent first; the rest counted)."""
COMMANDS = 10
"""Commands the header lists, at most (the latest; the rest counted)."""
RUNNERS = 20
"""Runners the header lists, at most (the busiest; the rest counted)."""

SCRIPT = """
(function(){
  var tip=document.getElementById('tip');
  document.addEventListener('mousemove',function(e){
    var t=e.target.closest?e.target.closest('[data-tip]'):null;
    if(!t){tip.style.display='none';return;}
    tip.textContent=t.getAttribute('data-tip');
    tip.style.display='block';
    var x=Math.min(e.clientX+12,window.innerWidth-tip.offsetWidth-8);
    tip.style.left=x+'px';tip.style.top=(e.clientY+14)+'px';
  });
  document.documentElement.setAttribute('data-ready','1');
})();
"""


def render_report(report: Report) -> str:
    """The whole page for ``report``."""
    f = report.figures
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        '<meta name="color-scheme" content="light dark">',
        f"<title>statequeue report: {escape(report.queue)}</title>",
        f"<style>{STYLE}</style></head><body>",
        _header(report),
        _section(
            "Throughput over time",
            "When did throughput drop? Attempts ended per minute, stacked by outcome: "
            f"{f.kinds[RETRIED]} retries (failed or deferred, then put back), "
            f"{report.deferred} deferrals (exit 75: try later), "
            f"{f.kinds[HELD]} held for a person, {f.kinds[INTERRUPTED]} interrupted"
            + _not_ended(f.in_flight_total),
            _legend() + throughput_svg(f.throughput),
        ),
        _section(
            "Timeline of attempts",
            "Which runner stalled? One lane per runner slot, one bar per attempt."
            + _sampled_note(report),
            _legend() + timeline_svg(f.timeline, f.first_start, f.last_end),
        ),
        _section(
            "Durations",
            "How long do attempts take? Done against not done, log scale; "
            "p50, p90 and p99 of the done attempts are marked.",
            _quantiles(report) + histogram_svg(f.histogram),
        ),
        _section(
            "Failures by reason",
            "Which failures came together? Unsuccessful attempts grouped by reason.",
            _failures(f.failures),
        ),
        _section(
            "Slowest attempts",
            _more(len(f.slowest), f.attempts, "attempts (the slowest first)"),
            _rows(f.slowest, "duration", span, "outcome"),
        ),
        _section(
            "Most retried items",
            _more(len(f.most_retried), f.retried_total, "retried items (the most attempts first)"),
            _rows(f.most_retried, "attempts", _count, "state now", attempt=False),
        ),
        _section(
            "Interrupted, not recovered yet",
            f"Attempts in flight when their runner died ({f.in_flight_total} in all, as "
            "`statequeue status` lists them; the latest started shown): the next run "
            "recovers them (--on-interrupted)."
            + _held_note(f.in_flight_held)
            + " Their end is not known (their processes may "
            "have died with the runner, or may still run): their bars in the timeline run "
            "to the time of this report.",
            _rows(f.in_flight, "started at", clock, "state now"),
        ),
        _section(
            "Interrupted and recovered",
            f"Attempts whose runner died ({f.interrupted_total} in all; the latest shown): "
            "from their start to the run that found the runner dead and recovered them "
            "(when it died in between is not recorded), and the item's state now: done "
            "means it was recovered.",
            _interrupted(f.interrupted),
        ),
        '<div id="tip"></div>',
        f"<script>{SCRIPT}</script></body></html>",
    ]
    return "\n".join(parts) + "\n"


def _count(value: float) -> str:
    return f"{value:.0f}"


def _text(user_text: str) -> str:
    """An item, reason, runner or host (any text a record holds) as the page
    shows it: as every terminal view
    does (core/textsafe.py: a byte that is not UTF-8 as ``\\xe9``, controls
    as ``\\n``), then HTML-escaped. A file name that is not UTF-8 would
    otherwise stop the page from being written at all."""
    return escape(escaped(user_text))


def _section(title: str, why: str, body: str) -> str:
    lead = f'<p class="why">{escape(why)}</p>' if why else ""
    return f"<section><h2>{escape(title)}</h2>{lead}{body}</section>"


def _legend() -> str:
    keys = "".join(f'<span><i class="k{k}"></i>{name}</span>' for k, name in enumerate(KIND_NAMES))
    return f'<div class="legend">{keys}</div>'


def _header(r: Report) -> str:
    f = r.figures
    rate = "-" if r.success_rate is None else f"{r.success_rate * 100:.1f}%"
    cards = [(name, r.counts.get(name, 0)) for name in ("pending", "running", "done", "failed")]
    cards += [(name, n) for name, n in r.counts.items() if name not in dict(cards) and n]
    card_html = "".join(f'<div class="card"><b>{n}</b>{_text(name)}</div>' for name, n in cards)
    runners = ", ".join(
        f"{_text(name or '?')}{f' ({_text(host)})' if host else ''}: {n}"
        for name, host, n in f.runners[:RUNNERS]
    )
    if len(f.runners) > RUNNERS:
        runners += f", and {len(f.runners) - RUNNERS} more"
    # As typed (core/command_text.py: quoted, controls escaped): not escaped again.
    commands = "<br>".join(f"<code>{escape(c)}</code>" for c in r.commands[-COMMANDS:]) or "-"
    if len(r.commands) > COMMANDS:
        commands += f"<br>and {len(r.commands) - COMMANDS} earlier ones (the last {COMMANDS} shown)"
    since = "" if r.since is None else f" (attempts of the last {span(r.since)})"
    rows = [
        ("store", escape(r.store)),
        ("made", escape(clock(r.now)) + escape(since)),
        ("success rate", f"{rate} of {_finished(r)}"),
        ("wall time", _wall(r)),
        ("attempts, by how each ended", _ended(f.kinds, f.in_flight_total, f.in_flight_held)),
        ("runners", f"{len(f.runners)} ({r.active_runners} alive now): {runners or '-'}"),
        ("hosts", _text(", ".join(r.hosts)) or "-"),
        ("commands", commands),
    ]
    head = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
    return (
        f"<header><h1>Queue {escape(r.queue)}</h1>"
        f'<div class="cards">{card_html}</div><dl class="head">{head}</dl></header>'
    )


def _finished(r: Report) -> str:
    """The items the success rate is of (``Report.success_rate``)."""
    if r.since is None:
        return "finished items"
    return f"items finished in the last {escape(span(r.since))} (done or failed)"


def _wall(r: Report) -> str:
    """From the first start to the last end; to the report's time while
    attempts are in flight with no end (their runner died): said so."""
    f = r.figures
    if r.wall_seconds is None or f.first_start is None:
        return "-"
    till = ""
    if f.in_flight:  # the fold ran them to the report's time
        till = " to the time of this report: attempts in flight when their runner died have no end"
    return f"{span(r.wall_seconds)} (from {escape(clock(f.first_start))}{till})"


def _ended(kinds: tuple[int, ...], in_flight: int, held: int = 0) -> str:
    """Ended attempts by kind; then those in flight when their runner died
    (``held`` of them still run by processes of a dead runner)."""
    text = ", ".join(f"{n} {KIND_NAMES[k]}" for k, n in enumerate(kinds)) or "0"
    if in_flight:
        text += f"; and {in_flight} in flight when their runner died, not recovered yet"
    if held:
        text += f" ({held} still run by processes of a dead runner)"
    return text


def _held_note(held: int) -> str:
    """What `status` says of the items a dead runner's processes still run."""
    if not held:
        return ""
    return (
        f" Of these, {held} (state now: orphaned) are still run by processes of a dead "
        "runner: no run takes them until those end; then the next run recovers them."
    )


def _not_ended(in_flight: int) -> str:
    if not in_flight:
        return "."
    return f" (and {in_flight} in flight when their runner died: not ended, not counted here)."


def _sampled_note(r: Report) -> str:
    t = r.figures.timeline
    if t.shown >= t.total:
        return ""
    if t.unsuccessful_shown >= t.unsuccessful:
        kept = f"all {t.unsuccessful} unsuccessful ones"
    else:
        kept = f"{t.unsuccessful_shown} of the {t.unsuccessful} unsuccessful ones (sampled evenly)"
    return (
        f" Showing {t.shown} of {t.total} attempts: the slowest ones, {kept}, "
        "and the rest sampled evenly."
    )


def _quantiles(r: Report) -> str:
    q = r.figures.histogram.quantiles
    cards = "".join(
        f'<div class="card"><b>{"-" if v is None else span(v)}</b>{k}</div>' for k, v in q.items()
    )
    return f'<div class="cards">{cards}</div>'


def _failures(groups: tuple[FailureGroup, ...]) -> str:
    if not groups:
        return '<p class="empty">No attempt failed.</p>'
    rows = "".join(
        f"<tr><td>{_text(g.reason)}</td><td class='n'>{g.count}</td>"
        f"<td class='item'>{'<br>'.join(_text(e) for e in g.examples)}</td>"
        f"<td class='n'>{_when(g.first_seen)}</td><td class='n'>{_when(g.last_seen)}</td></tr>"
        for g in groups[:REASONS]
    )
    rest = groups[REASONS:]
    more = ""
    if rest:
        attempts = sum(g.count for g in rest)
        more = (
            f"<tr><td colspan='5'>and {len(rest)} more reasons "
            f"({attempts} attempts), not listed</td></tr>"
        )
    return (
        "<table><tr><th>reason</th><th>attempts</th><th>example items</th>"
        f"<th>first seen</th><th>last seen</th></tr>{rows}{more}</table>"
    )


def _when(at: float | None) -> str:
    return "-" if at is None else escape(clock(at))


def _interrupted(rows: tuple[ItemRow, ...]) -> str:
    """Interrupted attempts: each from its start to its recovery (``value``)."""
    if not rows:
        return '<p class="empty">None.</p>'
    body = "".join(
        f"<tr><td class='item'>{_text(r.text) or f'#{r.item_id}'}</td>"
        f"<td class='n'>{r.item_id}</td><td class='n'>{r.attempt}</td>"
        f"<td class='n'>{_when(r.started)}</td><td class='n'>{_when(r.value)}</td>"
        f"<td>{_text(r.state)}</td></tr>"
        for r in rows
    )
    return (
        "<table><tr><th>item</th><th>id</th><th>attempt</th><th>started at</th>"
        f"<th>recovered at</th><th>state now</th></tr>{body}</table>"
    )


def _rows(
    rows: tuple[ItemRow, ...],
    what: str,
    show: Callable[[float], str],
    state: str,
    *,
    attempt: bool = True,
) -> str:
    """A table of items; ``attempt``: with the attempt's number (not for the
    most retried, whose ``what`` column is their attempts already)."""
    if not rows:
        return '<p class="empty">None.</p>'
    body = "".join(
        f"<tr><td class='item'>{_text(r.text) or f'#{r.item_id}'}</td>"
        f"<td class='n'>{r.item_id}</td>"
        + (f"<td class='n'>{r.attempt}</td>" if attempt else "")
        + f"<td class='n'>{escape(show(r.value))}</td><td>{_text(r.state)}</td></tr>"
        for r in rows
    )
    number = "<th>attempt</th>" if attempt else ""
    return (
        f"<table><tr><th>item</th><th>id</th>{number}<th>{escape(what)}</th>"
        f"<th>{escape(state)}</th></tr>{body}</table>"
    )


def _more(shown: int, total: int, what: str) -> str:
    """What a cut list says of itself (``10 of 52 WHAT shown; 42 more not
    listed.``), or "" when it shows them all."""
    if total <= shown:
        return ""
    return f"{shown} of {total} {what} shown; {total - shown} more not listed."
