"""Shell completion of queue names (``-q``, ``drop``) and state names (``--state``)."""

from __future__ import annotations

from typing import Any

from statequeue.core.errors import StateQueueError
from statequeue.core.location import resolve_home
from statequeue.core.models import ItemState


def complete_state(incomplete: str) -> list[str]:
    return [s.value for s in ItemState if s.value.startswith(incomplete)]


def complete_queue(ctx: Any, incomplete: str) -> list[str]:
    """Queues under the home named on the command line (or the default home)."""
    home = None
    while ctx is not None and home is None:  # a command's --home wins over the global one
        home = ctx.params.get("home")
        ctx = ctx.parent
    try:
        root = resolve_home(home)
        names = sorted(p.name for p in root.iterdir() if (p / "journal.jsonl").exists())
    except (OSError, StateQueueError):
        return []  # completion must never fail loudly
    return [n for n in names if n.startswith(incomplete)]
