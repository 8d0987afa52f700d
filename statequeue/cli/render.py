"""Rendering results for people (rich on a terminal, plain text otherwise) and JSON."""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Any

import orjson

from statequeue.durations import format_duration

if TYPE_CHECKING:
    from statequeue.views import Status


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


def shown(item: str, width: int = 80) -> str:
    """An item as it can be printed on one line (escapes, undecodable bytes)."""
    text = item.encode("utf-8", "backslashreplace").decode("utf-8")
    text = text.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return text if len(text) <= width else text[: width - 1] + "…"


def status_text(status: Status) -> str:
    c = status.counts
    finished = c["done"] + c["failed"] + c["cancelled"]
    share = f" ({100 * finished / status.total:.1f}% finished)" if status.total else ""
    lines = [
        f"queue {status.queue}: {status.total} items{share}",
        "  " + "  ".join(f"{k} {c[k]}" for k in c),
    ]
    if status.paused:
        lines.append("PAUSED: runners take no new items (`statequeue resume`)")
    if status.rate and status.runners:
        eta = f", ETA {format_duration(status.eta)}" if status.eta else ""
        lines.append(f"rate: {status.rate * 60:.1f} items/min{eta}")
    if status.runners:
        for r in status.runners:
            items = ", ".join(str(i) for i in r.running) or "none"
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.started_at))
            lines.append(
                f"runner: active (pid {r.pid} on {r.host}, since {since}, running items: {items})"
            )
    else:
        lines.append("runner: none active")
    if status.interrupted:
        ids = ", ".join(str(i) for i in status.interrupted[:20])
        lines.append(f"interrupted (runner died; the next run recovers them): {ids}")
    if status.held:
        ids = ", ".join(str(i) for i in status.held[:20])
        lines.append(f"held (poison or on hold): {ids}")
    if status.recent_failures:
        lines.append("recent failures:")
        for f in status.recent_failures:
            lines.append(f"  #{f.item_id} {shown(f.item, 50)} (attempt {f.attempts}): {f.reason}")
    return "\n".join(lines)


def watch_status(queue: Any, *, interval: float, json: bool) -> None:
    """Redraw the status until Ctrl-C: in place on a terminal, appended otherwise."""
    live = None
    if use_color(sys.stdout) and not json:
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text

        live = Live(Text(""), console=Console(), auto_refresh=False)
        live.start()
    try:
        while True:
            st = queue.status()
            if json:
                emit_json(st.to_json())
            elif live is not None:
                from rich.text import Text

                live.update(Text(status_text(st)), refresh=True)
            else:
                print(status_text(st) + "\n", flush=True)
            time.sleep(interval)
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


__all__ = ["emit_json", "err", "format_duration", "human_bytes", "shown", "status_text"]
