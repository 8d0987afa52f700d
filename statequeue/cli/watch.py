"""`statequeue status --watch`: redraw the status, with `stats`'s rate and ETA, until Ctrl-C.

Apart from render.py, which it builds on with stats_view.py (whose figures
use render's text helpers): the loop in render.py made the two import each other.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import time
from types import FrameType
from typing import Any

from statequeue.cli.render import emit_json, status_text, use_color
from statequeue.cli.stats_view import watch_lines
from statequeue.cli.watch_running import RunningTracker, progress_bar, running_lines
from statequeue.core.exitcodes import ExitCode
from statequeue.stats.rates import LiveRate

__all__ = ["watch_status"]


def watch_status(queue: Any, *, interval: float, json: bool) -> None:
    """Redraw the status until Ctrl-C (or SIGTERM, as `timeout` sends): in place
    on a terminal, appended otherwise. The terminal is restored either way."""
    signal.signal(signal.SIGTERM, _stop_on_term)
    live = None
    if use_color(sys.stdout) and not json:
        # lazy: start-up time (rich only when drawing on a terminal)
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text

        live = Live(Text(""), console=Console(), auto_refresh=False)
        live.start()
    rate = LiveRate(queue.store)  # `stats`'s rate and ETA
    tracker = RunningTracker(queue)
    try:
        while True:
            st = queue.status()
            if json:
                emit_json(st.to_json())
            else:
                left = st.counts.get("pending", 0) + st.counts.get("running", 0)
                # One rate and ETA on the screen, the one `stats` gives (its
                # window stated), not also status's own one-minute figure.
                one_rate = dataclasses.replace(st, rate=None)
                lines = watch_lines(rate, left, paused=st.paused, active=bool(st.runners))
                running = tracker.running_items(st)
                texts = {r.item_id: r.text for r in running}
                lines += running_lines(running, st)
                if live is not None and st.total:
                    lines.append(progress_bar(st))
                text = "\n".join([status_text(one_rate, texts), *lines])
                if live is not None:
                    from rich.text import Text  # lazy: start-up time (rich)

                    live.update(Text(text), refresh=True)
                else:
                    print(text + "\n", flush=True)
            time.sleep(interval)
    finally:  # Ctrl-C goes on up: exit 130 (SIGINT), as for every other command
        if live is not None:
            live.stop()  # shows the cursor again


def _stop_on_term(signum: int, frame: FrameType | None) -> None:
    # An exception, not an exit from the handler: the `finally` above runs
    # and gives the terminal its cursor back.
    raise SystemExit(int(ExitCode.INTERRUPTED_TERM))
