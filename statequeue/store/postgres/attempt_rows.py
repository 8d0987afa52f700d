"""The PostgreSQL store's finished attempts for `stats`, streamed from the server.

One row per finished attempt: the ``results`` table (one row per token), and
crash recoveries (``intr`` events that count a crash). The runner of an
attempt is its ``start`` event's; its host is the runner's registration; an
interrupted attempt's start time is that event's too.
A server-side cursor hands the rows over a batch at a time, so neither side
holds them all.

Compaction (archive.py) moves a done or cancelled item's results and events,
its ``start`` and ``intr`` ones among them, to ``archived_results`` and
``archived_events`` in one transaction: each attempt is read from the pair of
tables it is in, so `stats` and `report` count the archive as the journal
store counts its own. One statement, one snapshot: an attempt that a
compaction moves meanwhile is read once, from one side or the other.
"""

from __future__ import annotations

from collections.abc import Iterator

from statequeue.core.models import VERIFIED_REASONS
from statequeue.stats.attempts import Attempt
from statequeue.store.postgres.connection import Connection

BATCH = 10_000

# The attempt's ``start`` event; for an imported item (no ``start``: an
# export keeps none) its ``end`` or ``intr``, which name runner and host.
_RUNNER_OF = """
LEFT JOIN LATERAL (
    SELECT e.body->>'runner' AS runner, e.body->>'host' AS host,
           CASE WHEN e.body->>'t' = 'start' THEN (e.body->>'at')::float8
                ELSE (e.body->>'started')::float8 END AS at
    FROM statequeue.{events} e
    WHERE e.queue = {t}.queue AND e.id = {t}.id AND e.body->>'t' IN ('start', 'end', 'intr')
      AND (e.body->>'attempt')::int = {attempt}
    ORDER BY e.body->>'t' = 'start' DESC, e.seq DESC LIMIT 1
) s ON true
LEFT JOIN statequeue.runners ru ON ru.queue = {t}.queue AND ru.runner_id = s.runner
"""


def _ended(results: str, events: str) -> str:
    """The attempts that ended with a row in ``results``, each one's runner
    from its ``start`` among ``events`` (the same side: moved together)."""
    return f"""
SELECT r.id, r.attempt, r.state, r.ok, r.duration, r.reason, r.exit_code, r.signal,
       r.reason LIKE 'timed out%%', coalesce(s.runner, ''), coalesce(ru.host, s.host, ''),
       r.at, false, NULL::float8
FROM statequeue.{results} r
{_RUNNER_OF.format(events=events, t="r", attempt="r.attempt")}
WHERE r.queue = %(q)s AND (%(since)s::float8 IS NULL OR r.at >= %(since)s::float8)
"""


def _crashed(events: str) -> str:
    """The attempts that a crash recovery ended (``intr`` among ``events``)."""
    return f"""
SELECT i.id, (i.body->>'attempt')::int, i.body->>'state', false, NULL, 'interrupted', NULL,
       NULL, false, coalesce(s.runner, ''), coalesce(ru.host, s.host, ''),
       (i.body->>'at')::float8, true, coalesce(s.at, (i.body->>'started')::float8)
FROM statequeue.{events} i
{_RUNNER_OF.format(events=events, t="i", attempt="(i.body->>'attempt')::int")}
WHERE i.queue = %(q)s AND i.body->>'t' = 'intr' AND i.body->'crashes' IS NOT NULL
  AND (%(since)s::float8 IS NULL OR (i.body->>'at')::float8 >= %(since)s::float8)
"""


ATTEMPTS = "UNION ALL".join(
    (
        _ended("results", "events"),
        _ended("archived_results", "archived_events"),
        _crashed("events"),
        _crashed("archived_events"),
    )
)


def iter_attempts(conn: Connection, queue: str, since: float | None) -> Iterator[Attempt]:
    """Every finished attempt of ``queue`` (ended at ``since`` or later, when given),
    through a server-side cursor inside one read transaction."""
    with conn.transaction(), conn.cursor(name="statequeue_stats") as cur:
        cur.itersize = BATCH
        cur.execute(ATTEMPTS, {"q": queue, "since": since})
        for row in cur:
            yield Attempt(
                int(row[0]),
                int(row[1] or 0),
                str(row[2] or ""),
                bool(row[3]),
                None if row[5] in VERIFIED_REASONS else row[4],  # as stats.attempts.from_end
                str(row[5]),
                row[6],
                row[7],
                bool(row[8]),
                str(row[9]),
                str(row[10]),
                row[11],
                bool(row[12]),
                row[13],  # an interrupted attempt's start: its ``start`` event's time
            )
