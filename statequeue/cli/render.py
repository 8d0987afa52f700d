"""Rendering results for people (rich on a terminal, plain text otherwise) and JSON."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from statequeue.cli.clock import local_time
from statequeue.cli.errors import with_queue
from statequeue.core.durations import format_duration
from statequeue.core.rates import rate_text
from statequeue.core.textsafe import escaped, shown

if TYPE_CHECKING:
    from statequeue.core.views import ActiveRunner, Status


def emit_json(value: Any) -> None:
    sys.stdout.buffer.write(orjson.dumps(value) + b"\n")
    sys.stdout.flush()


def err(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def print_notices(notices: list[str]) -> None:
    for notice in notices:
        err(f"statequeue: {notice}")


def use_color(stream: Any = None) -> bool:
    stream = stream or sys.stdout
    if os.environ.get("NO_COLOR"):
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


def plural(count: int, noun: str) -> str:
    """``1 item``, ``2 items``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def counted_ids(ids: Sequence[int], shown_at_most: int = 20) -> str:
    """``2 items: #8, #9`` (the first ``shown_at_most`` ids, then ``...``): a
    count and the ids, never a bare id that reads as a count."""
    listed = ", ".join(f"#{i}" for i in ids[:shown_at_most])
    more = ", ..." if len(ids) > shown_at_most else ""
    return f"{plural(len(ids), 'item')}: {listed}{more}"


def _share(part: int, total: int) -> str:
    """``part`` of ``total`` in percent, rounded down to 0.1: never "100.0%"
    while anything is left (1,999 of 2,000 is 99.9%, not 100.0%)."""
    tenths = 1000 * part // total
    return f"{tenths // 10}.{tenths % 10}%"


def status_text(status: Status, texts: Mapping[int, str] | None = None) -> str:
    """``status`` for people; ``texts`` names running items by their text."""
    c = status.counts
    lines = [_status_headline(status), "  " + "  ".join(f"{k} {c[k]}" for k in c)]
    if status.paused:
        lines.append(with_queue("PAUSED: runners take no new items (`statequeue resume`)"))
    if status.rate and status.runners:
        eta = f", ETA {format_duration(status.eta)}" if status.eta else ""
        if status.paused:
            eta = ", ETA paused"  # runners take no new items until `resume`
        lines.append(f"rate: {status.rate * 60:.1f} items/min{eta}")
    if status.pace is not None or status.deferred:
        lines.append(_pace_line(status))
    if status.waiting and status.next_due is not None:
        lines.append(waiting_line(status.waiting, status.next_due))
    lines += _runner_lines(status, texts or {})
    if status.interrupted:
        ids = counted_ids(status.interrupted)
        # A runner stopped by a signal lives: its lease ended, it did not die.
        why = "runner stopped or died" if any(r.stopped for r in status.runners) else "runner died"
        lines.append(f"interrupted ({why}; the next run recovers them): {ids}")
    if status.held_by_dead_runner:
        lines.append(held_by_dead_runner_line(status.held_by_dead_runner))
    if status.interrupted_pending:
        ids = counted_ids(status.interrupted_pending)
        lines.append(f"interrupted, back to pending (--verify checks them first): {ids}")
    if status.held:
        lines.append(f"held (poison or on hold): {counted_ids(status.held)}")
    if status.leftovers:
        lines.append(_leftovers_line(status.leftovers))
    lines += _failure_lines(status)
    lines += _next_steps(status)
    return "\n".join(lines)


def waiting_line(count: int, due: float, now: float | None = None) -> str:
    """The pending items a retry's backoff or a deferral keeps waiting: no
    run takes them before ``due``, so a run started now waits for it."""
    import time  # lazy: start-up time (only when items wait)

    left = max(0.0, due - (time.time() if now is None else now))
    when = local_time(due, "%H:%M:%S" if left < 12 * 3600 else "%Y-%m-%d %H:%M:%S")
    items = plural(count, "pending item")
    return f"waiting: {items} not due before {when} (in {format_duration(math.ceil(left))})"


def held_by_dead_runner_line(ids: Sequence[int]) -> str:
    """The running items whose runner died while a process of their attempt
    still holds the claim (its keeper died too): no run takes them yet."""
    return (
        "still run by processes of a dead runner (no run takes them until those end; "
        f"then the next run recovers them): {counted_ids(ids)}"
    )


def _leftovers_line(leftovers: Sequence[tuple[int, Sequence[int]]]) -> str:
    """The pending items a process of an earlier attempt still keeps from
    every run (its claim is held until it ends), with its pids."""
    shown = [f"#{i} ({pids_text(pids)})" for i, pids in leftovers[:20]]
    more = ", ..." if len(leftovers) > 20 else ""
    return (
        f"pending, waiting for a process of an earlier attempt to end: "
        f"{plural(len(leftovers), 'item')}: {', '.join(shown)}{more}"
    )


def pids_text(pids: Sequence[int]) -> str:
    """``pid 12``, ``pids 12, 14``, or ``pid unknown``."""
    if not pids:
        return "pid unknown"
    return ("pid " if len(pids) == 1 else "pids ") + ", ".join(str(p) for p in pids)


def _pace_line(status: Status) -> str:
    """The starts of the last minute (every runner's) beside the shared start
    rate and its limit (``run --rate``), and the deferred items."""
    deferred = f"deferred {status.deferred}"
    if status.pace is None:
        return deferred
    now, limit = rate_text(status.pace.current), rate_text(status.pace.limit)
    paced = f"paced at {now} of at most {limit} (burst {status.pace.burst})"
    if status.starts is None:
        return f"start rate: {paced}; {deferred}"
    per_second = status.starts.per_second
    started = (
        f"{status.starts.count} at once" if per_second is None else f"{rate_text(per_second)}"
    ) + " in the last minute (all runners)"
    if status.over_limit:
        paced += ": MORE than the limit, some runner is not paced (no --rate)"
    return f"start rate: {started}, {paced}; {deferred}"


def _status_headline(status: Status) -> str:
    """Done and failed apart, failures counted: a queue where everything
    failed is not "100% done", and one failure in 2,000 is not "0.1%"."""
    c, total = status.counts, status.total
    head = f"queue {status.queue}: {plural(total, 'item')}"
    if not total:
        return head
    parts = [f"{_share(c['done'], total)} done"]
    parts += [f"{c[k]} {k}" for k in ("failed", "cancelled") if c[k]]
    return f"{head} ({', '.join(parts)})"


def running_texts(queue: Any, status: Status) -> dict[int, str]:
    """The text of each running item ``status`` names (none read when none runs)."""
    ids = [i for r in status.runners for i in r.running[:RUNNING_SHOWN]]
    return queue.live_texts(ids) if ids else {}


RUNNING_SHOWN = 5
"""Running items named per runner; the rest are counted."""


def _runner_lines(status: Status, texts: Mapping[int, str]) -> list[str]:
    if not status.runners:
        return ["runner: none active"]
    lines = []
    for r in status.runners:
        since = local_time(r.started_at)
        where = f"pid {r.pid} on {shown(r.host)}, since {since}"
        lines.append(f"runner: {_liveness(r)} ({where}, {_running(r.running, texts)})")
        lines += worker_lines(r)
    return lines


def worker_lines(runner: ActiveRunner) -> list[str]:
    """The persistent workers of a live runner (`run --persistent`), one line each."""
    lines = []
    for w in runner.workers:
        rss = "" if w.rss is None else f", RSS {human_bytes(w.rss)}"
        lines.append(f"  worker {w.slot}: pid {w.pid}, {plural(w.items, 'item')} done{rss}")
    return lines


def _liveness(r: ActiveRunner) -> str:
    """``active``, or for a runner that missed its heartbeats (killed -9 on
    another host, cut off) how long it has been silent and when its lease
    ends: its items are taken over then, not before. A runner of this host
    stopped by a signal says so, and how to continue it."""
    if r.stopped:
        said = f"STOPPED by a signal (ctrl-Z or SIGSTOP; `kill -CONT {r.pid}` continues it)"
        ended, heard, lease = r.lease_ends_at, r.heard_ago, r.lease
        if ended is not None and heard is not None and lease is not None and heard > lease:
            return f"{said}; its lease ended at {local_time(ended)}"
        return said
    if r.heard_ago is None or r.lease is None or r.lease_ends_at is None:
        return "active"
    if r.heard_ago <= r.lease / 2:  # it renews every third of the lease
        return "active"
    ends = local_time(r.lease_ends_at)
    return f"not heard from for {r.heard_ago:.0f} s; its lease ends at {ends}"


def _running(ids: Sequence[int], texts: Mapping[int, str]) -> str:
    """``running 2 items: #2 a.pdf, #7 b.pdf``: ids with their text, never a bare
    number that reads as a count."""
    if not ids:
        return "running nothing"
    named = [f"#{i} {shown(texts[i], 40)}" if i in texts else f"#{i}" for i in ids[:RUNNING_SHOWN]]
    more = f", … {len(ids) - RUNNING_SHOWN} more" if len(ids) > RUNNING_SHOWN else ""
    return f"running {plural(len(ids), 'item')}: {', '.join(named)}{more}"


def _failure_lines(status: Status) -> list[str]:
    if not status.recent_failures:
        return []
    lines = ["recent failures:"]
    for f in status.recent_failures:
        lines.append(
            f"  #{f.item_id} {shown(f.item, 50)} (attempt {f.attempts}): {shown(f.reason)}"
        )
        if f.stderr_last:
            lines.append(f"      stderr: {shown(f.stderr_last, 100)}")
    more = status.counts.get("failed", 0) - len(status.recent_failures)
    if more > 0:
        lines.append(f"  and {more} more: `{_command(status, 'list -s failed')}`")
    return lines


def _next_steps(status: Status) -> list[str]:
    """The command to run next, ready to copy."""
    steps = []
    if status.counts.get("failed"):
        steps.append(f"next: `{_command(status, 'retry --failed')}` runs the failed items again")
    if status.counts.get("held"):
        steps.append(f"next: `{_command(status, 'retry --held')}` runs the held items again")
    return steps


def _command(status: Status, args: str) -> str:
    queue = "" if status.queue == "default" else f" -q {status.queue}"
    return f"statequeue{queue} {args}"


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


__all__ = [
    "emit_json",
    "err",
    "escaped",
    "format_duration",
    "human_bytes",
    "plural",
    "running_texts",
    "shown",
    "status_text",
]
