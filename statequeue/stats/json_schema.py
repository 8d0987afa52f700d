"""`statequeue stats --json`: the ``Stats`` figures under a versioned schema.

The schema is named by ``"schema": "statequeue.stats/1"``; a change that
removes or renames a key, or changes its meaning, gets a new number (keys
may be added within a version). The `commands` help page documents every key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # types only: figures.py imports this module to serialise its Stats
    from statequeue.stats.figures import Group, Stats

STATS_SCHEMA = "statequeue.stats/1"


def stats_json(s: Stats) -> dict[str, Any]:
    """``s`` as the ``stats --json`` document (schema ``STATS_SCHEMA``)."""
    d = s.durations
    return {
        "schema": STATS_SCHEMA,
        "queue": s.queue,
        "generated_at": s.now,
        "since_seconds": s.since,
        "counts": dict(s.counts),
        "attempts": s.attempts,
        "durations": {
            "count": d.count,
            "min": d.min,
            "max": d.max,
            "mean": d.mean,
            **d.quantiles,
            "relative_error": d.error,
            "histogram": [{"from": lo, "to": hi, "count": n} for lo, hi, n in d.histogram],
        },
        "throughput": {
            "start": s.throughput.start,
            "bucket_seconds": s.throughput.bucket_seconds,
            "finished": list(s.throughput.counts),
            "per_minute": s.throughput.per_minute(),
        },
        "rate": {
            "window_seconds": s.rate_window,
            "finished_in_window": s.recent_finishes,
            "per_minute": None if s.rate is None else s.rate * 60,
        },
        "eta": {
            "left": s.left,
            "seconds": s.eta,
            "runner_active": s.runner_active,
            "paused": s.paused,
        },
        "deferred": s.deferred,
        "failures": {
            "attempts": s.failed_attempts,
            "reasons": [
                {
                    "reason": g.reason,
                    "count": g.count,
                    "example": {"id": g.example_id, "attempt": g.example_attempt},
                }
                for g in s.reasons
            ],
            "retried_items": s.retried_items,
            "held": list(s.held),
        },
        "slowest": [
            {"id": x.item_id, "attempt": x.attempt, "duration": x.duration} for x in s.slowest
        ],
        "runners": [_group(g, runner=True) for g in s.runners],
        "hosts": [_group(g, runner=False) for g in s.hosts],
    }


def _group(g: Group, *, runner: bool) -> dict[str, Any]:
    key = {"runner": g.name, "host": g.host} if runner else {"host": g.name}
    return {**key, "attempts": g.attempts, "failed": g.failed, "failure_rate": g.failure_rate}
