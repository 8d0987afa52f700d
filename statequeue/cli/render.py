"""Rendering results for people (rich on a terminal, plain text otherwise) and JSON."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

import orjson

from statequeue.cli.clock import local_time
from statequeue.core.durations import format_duration
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


def _share(part: int, total: int) -> str:
    return f"{100 * part / total:.1f}%"


def status_text(status: Status) -> str:
    c = status.counts
    lines = [_status_headline(status), "  " + "  ".join(f"{k} {c[k]}" for k in c)]
    if status.paused:
        lines.append("PAUSED: runners take no new items (`statequeue resume`)")
    if status.rate and status.runners:
        eta = f", ETA {format_duration(status.eta)}" if status.eta else ""
        if status.paused:
            eta = ", ETA paused"  # runners take no new items until `resume`
        lines.append(f"rate: {status.rate * 60:.1f} items/min{eta}")
    lines += _runner_lines(status)
    if status.interrupted:
        ids = ", ".join(str(i) for i in status.interrupted[:20])
        lines.append(f"interrupted (runner died; the next run recovers them): {ids}")
    if status.held:
        ids = ", ".join(str(i) for i in status.held[:20])
        lines.append(f"held (poison or on hold): {ids}")
    lines += _failure_lines(status)
    lines += _next_steps(status)
    return "\n".join(lines)


def _status_headline(status: Status) -> str:
    """Done and failed apart: a queue where everything failed is not "100% done"."""
    c, total = status.counts, status.total
    head = f"queue {status.queue}: {plural(total, 'item')}"
    if not total:
        return head
    parts = [f"{_share(c['done'], total)} done"]
    parts += [f"{_share(c[k], total)} {k}" for k in ("failed", "cancelled") if c[k]]
    return f"{head} ({', '.join(parts)})"


def _runner_lines(status: Status) -> list[str]:
    if not status.runners:
        return ["runner: none active"]
    lines = []
    for r in status.runners:
        items = ", ".join(str(i) for i in r.running) or "none"
        since = local_time(r.started_at)
        where = f"pid {r.pid} on {shown(r.host)}, since {since}"
        lines.append(f"runner: active ({where}, running items: {items})")
        lines += worker_lines(r)
    return lines


def worker_lines(runner: ActiveRunner) -> list[str]:
    """The persistent workers of a live runner (`run --persistent`), one line each."""
    lines = []
    for w in runner.workers:
        rss = "" if w.rss is None else f", RSS {human_bytes(w.rss)}"
        lines.append(f"  worker {w.slot}: pid {w.pid}, {plural(w.items, 'item')} done{rss}")
    return lines


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
    "shown",
    "status_text",
]
