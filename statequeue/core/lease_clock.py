"""The clock leases are fenced on, in this process and in the keeper.

A lease ends on the database's clock, which goes on while this machine is
suspended; CLOCK_MONOTONIC does not, so after a suspend a runner timed on it
would think its leases younger than they are and leave a child running beside
the item's next holder. CLOCK_BOOTTIME (Linux) counts the suspended time too.
Where the platform lacks it, the monotonic clock is used, and promise 4 then
assumes the machine is not suspended while it holds a lease.

The keeper (keeper_process.py) imports this very module, even as a script
under ``python -I -S`` (so it stays standard library only): the deadlines the
runner sends it are read on the same clock.
"""

from __future__ import annotations

import time

CLOCK: int | None = getattr(time, "CLOCK_BOOTTIME", None)
"""The clock id ``now`` reads (None: ``time.monotonic``)."""


def now() -> float:
    """Seconds on the lease clock (CLOCK_BOOTTIME where there is one)."""
    if CLOCK is None:
        return time.monotonic()
    return time.clock_gettime(CLOCK)
