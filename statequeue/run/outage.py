"""A runner's store outage: how long it may last, and what the runner says of it.

A store reached over a network (PostgreSQL) may go away: a restart, a
failover, a partition. The runner then fences the items whose leases run out
meanwhile (they are, or soon will be, another runner's), keeps the results of
the children that end (written once the store is back; a claim taken over
meanwhile records nothing), and tries again with backoff. Each store call
reconnects for ``OUTAGE_SLICE`` seconds at most, so that between tries the
runner sees to its signals, its children and --max-time. It gives up
(StoreUnreachable: exit 11) once the outage has lasted ``--give-up-after``
(default: never with --follow, ``DEFAULT_GIVE_UP`` without), or when
--max-time runs out during it. A signal ends the run as it would otherwise
(exit 130 or 143), leaving what it could not write to recovery.
"""

from __future__ import annotations

from statequeue.core.durations import format_setting
from statequeue.core.errors import StoreUnreachable

OUTAGE_SLICE = 1.0
"""Seconds one store call of a runner keeps reconnecting before the runner looks around."""
OUTAGE_TICK = 0.1
"""Seconds between the runner's looks at its children and signals during an outage."""
DEFAULT_GIVE_UP = 600.0
"""--give-up-after without --follow: 10 minutes."""


def outage_limit(give_up_after: float | None, *, follow: bool) -> float | None:
    """The longest outage a run rides out (None: no limit), from --give-up-after
    (None: the default; 0: never)."""
    if give_up_after is None:
        return None if follow else DEFAULT_GIVE_UP
    return give_up_after or None


class Outage:
    """One stretch of time in which the runner's store could not be reached."""

    def __init__(self, began: float, limit: float | None, error: StoreUnreachable) -> None:
        self.began = began  # time.monotonic() the runner met it
        self.limit = limit
        self.error = error

    def start_text(self) -> str:
        then = "never gives up" if self.limit is None else f"gives up after {_for(self.limit)}"
        return (
            f"warning: {self.error}; reconnecting (--give-up-after: {then}); items whose "
            "lease runs out meanwhile are stopped and left to another runner"
        )

    def end_text(self, now: float) -> str:
        return f"the store is reachable again after {_for(now - self.began)}; carrying on"

    def check(self, now: float, *, out_of_time: bool) -> None:
        """StoreUnreachable if the run must give up now."""
        lasted = now - self.began
        if self.limit is not None and lasted >= self.limit:
            raise StoreUnreachable(
                f"{self.error} (unreachable for {_for(lasted)}: gave up, --give-up-after "
                f"{format_setting(self.limit)})"
            )
        if out_of_time:
            raise StoreUnreachable(f"{self.error} (--max-time ran out during the outage)")


def _for(seconds: float) -> str:
    return format_setting(round(seconds, 1))
