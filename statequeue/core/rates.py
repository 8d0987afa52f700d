"""Rate limits as users type them (``20/s``, ``90/m``, ``1000/h``), and the
exit status that asks for an item to be tried later.

Kept apart from the pacing itself (the store's token bucket, the runner's
pacing) so that the CLI, the library and every store read one parser.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from statequeue.core.errors import UsageError

TRY_LATER_EXIT = 75
"""EX_TEMPFAIL (sysexits.h, as sendmail uses it): the command asks to be tried later."""
DEFAULT_MAX_DEFERRALS = 100
"""How many times an item may be deferred (``--max-deferrals``) before it fails."""
MAX_DEFER = 86400.0
"""Seconds: the longest a deferral (exit 75's ``retry_after``, a worker's
``later``, ``TryLater(seconds)``) puts an item off; a longer ask waits a day."""


def delay_problem(seconds: object) -> str | None:
    """Why ``seconds`` (``TryLater(seconds)``, ``item.later(seconds)``) is no
    wait a deferral can have, as the reason of the attempt it fails; None when
    it is one (a number >= 0, or None: the adaptive backoff)."""
    if seconds is None or (
        isinstance(seconds, int) and not isinstance(seconds, bool) and seconds >= 0
    ):
        return None  # an int past a float's range waits MAX_DEFER, as any long ask
    if isinstance(seconds, float) and math.isfinite(seconds) and seconds >= 0:
        return None
    try:
        shown = ascii(seconds)  # ascii: any text a record can hold
    except Exception:  # a __repr__ that fails: its type says enough
        shown = f"a {type(seconds).__name__}"
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return f"TryLater: seconds must be a number >= 0, not {shown}"


_PER = {"s": 1.0, "m": 60.0, "h": 3600.0}
# Compiled on first use (re caches it): most commands never parse a rate.
_RATE = r"((?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)\s*/\s*(s|m|h)"


MIN_RATE = 1e-9
"""One start in 31 years: a slower rate's wait would not fit the clock."""
MAX_RATE = 1e9
"""Starts per second beyond what any run could make (as ``MAX_BURST``): a
larger number is a typo, and ``inf`` no rate."""
MAX_BURST = 10**9
"""More starts at once than any run could make: the bound keeps the bucket storable."""


@dataclass(frozen=True)
class RateLimit:
    """At most ``per_second`` item starts per second for the whole queue,
    with up to ``burst`` at once after a pause."""

    per_second: float
    burst: int = 1
    text: str = ""
    """As the user wrote it (``20/s``), for messages and ``status``."""

    def __post_init__(self) -> None:
        if not self.per_second > 0:
            raise UsageError(f"the rate must be above 0, not {self.per_second:.10g}/s")
        if not self.per_second <= MAX_RATE:  # inf, or a typo
            raise UsageError(
                f"the rate must be at most {MAX_RATE:g}/s, not {self.per_second:.10g}/s"
            )
        if self.per_second < MIN_RATE:  # 1e-300/s: a wait past what a clock can hold
            raise UsageError(
                f"the rate must be at least {MIN_RATE:g}/s, not {self.per_second:.10g}/s"
            )
        if not 1 <= self.burst <= MAX_BURST:  # past 64 bits the queue's bucket could not be saved
            raise UsageError(f"--burst must be from 1 to {MAX_BURST}, not {self.burst}")


def parse_rate(text: str, burst: int = 1) -> RateLimit:
    """The rate in ``text`` (``N/s``, ``N/m`` or ``N/h``; a bare ``N`` is per
    second, as the library's ``rate=N``); UsageError for anything else, for 0
    and for a negative rate."""
    raw = text.strip().lower()
    if raw.startswith("-") or raw in ("0", "0.0"):
        raise UsageError(f"invalid rate {text!r}: must be above 0 (e.g. 20/s, 90/m, 1000/h)")
    match = re.fullmatch(_RATE, raw if "/" in raw else raw + "/s")  # a bare number: per second
    if match is None:
        raise UsageError(
            f"invalid rate {text!r}: use a number per second, minute or hour: 20/s, 90/m, 1000/h"
        )
    per_second = float(match.group(1)) / _PER[match.group(2)]
    if per_second <= 0:
        raise UsageError(f"invalid rate {text!r}: must be above 0")
    return RateLimit(per_second, burst, text.strip())


def rate_text(per_second: float) -> str:
    """A rate for people: per second, or per minute or hour when slow."""
    if per_second >= 1:
        return f"{per_second:.3g}/s"
    if per_second * 60 >= 1:
        return f"{per_second * 60:.3g}/m"
    return f"{per_second * 3600:.3g}/h"


@dataclass(frozen=True)
class Pace:
    """A queue's shared start rate as the store holds it: ``current`` (lowered
    by deferrals, raised by successes) never above ``limit``."""

    current: float
    limit: float
    burst: int
    set_at: float = 0.0
    """When the limit was last set (0: not known)."""


def as_rate(value: RateLimit | str | float | None) -> RateLimit | None:
    """The library's ``rate=``: a RateLimit, text as ``run --rate`` takes it
    (``"20/s"``), or a number of starts per second; None for no limit."""
    if value is None or isinstance(value, RateLimit):
        return value
    if isinstance(value, str):
        return parse_rate(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(f"rate must be like '20/s' or a number per second, not {value!r}")
    try:
        per_second = float(value)
    except OverflowError:  # an int past float's range
        raise UsageError("rate is too large to be a number of starts per second") from None
    return RateLimit(per_second, 1, rate_text(per_second))
