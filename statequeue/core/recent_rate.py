"""The one estimator of a queue's current rate (items finished per second),
which every view gives: `status` (text and JSON), `status --watch`, `stats`,
on every store. Each store says what it knows; this module does the sums.

A rate is the finishes of a recent window over the time the work they count
took: from when that work *began* (the earliest start of the attempts
finished in the window, or of the starts recorded in it), never from the
first finish. Measured from the first finish, a batch that finishes together
(4 runners, 4 items of 3 s) looked instantaneous: 4 finishes over a few
milliseconds, hundreds of items a minute and an ETA of seconds, while 80 a
minute were finishing. The span is at most the window and at least
``MIN_SPAN`` (never a division by about 0).
"""

from __future__ import annotations

from collections.abc import Iterable

MIN_SPAN = 1.0
"""Seconds: the shortest span a rate is measured over."""
MIN_SPAN_MANY = 0.001
"""Seconds: the shortest span for a store that keeps only the last so many
times and has them all in the window: thousands of finishes are no batch
that finished together, and at ``MIN_SPAN`` the rate could not exceed the
count kept per second (2,000/s shown for 11,000/s)."""


def rate_span(began: float | None, now: float, window: float, floor: float = MIN_SPAN) -> float:
    """The seconds a rate at ``now`` is measured over: since ``began`` (when
    the work it counts began), at most ``window``, at least ``floor``; the
    window when nothing is known of when it began."""
    if began is None:
        return window
    return min(window, max(now - began, floor))


def recent_rate(
    finished: int, began: float | None, now: float, window: float, floor: float = MIN_SPAN
) -> float:
    """Items finished per second: ``finished`` (those of the last ``window``
    seconds) over ``rate_span(began, now, window, floor)``."""
    return finished / rate_span(began, now, window, floor)


def began_of(starts: Iterable[float], first_finish: float, since: float) -> float:
    """When the work of a window began, for a store that records starts and
    finishes apart (unpaired): the first start at or after ``since`` (the
    window's start), when it comes no later than ``first_finish`` (the first
    finish in the window); else ``since``: an attempt that finished in the
    window before any start in it began before the window."""
    first_start = min((t for t in starts if t >= since), default=None)
    if first_start is not None and first_start <= first_finish:
        return first_start
    return since


def start_rate(
    count: int, at_first: int, first: float, now: float, floor: float = MIN_SPAN
) -> float | None:
    """Items started per second, from ``count`` starts since ``first`` (the
    first of them), ``at_first`` of which came at that first moment (a run's
    first batch, a burst): those mark when the starting began and are not
    counted, as a rate measured from the first finish must not count the batch
    that finished together. None while every start came at that first moment."""
    if count <= at_first:
        return None
    return (count - at_first) / max(now - first, floor)


FIRST_BATCH = 0.01
"""Seconds: starts this close after the first one came with it (``start_rate``'s
``at_first``): a run's first batch, a burst. Short beside the gap between
paced starts (20 ms at 50/s); more starts in it, at a higher rate, are a few
of the many the rate counts."""
