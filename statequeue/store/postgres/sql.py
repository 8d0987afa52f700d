"""The statements the PostgreSQL store runs, named for what they do.

Queue names and items are always parameters, never spliced into the text.
"""

from __future__ import annotations

LEASE = "clock_timestamp() + make_interval(secs => %(lease)s)"
"""A lease end: the database's clock, read when the statement runs (after the
runner sent it, so no earlier than the runner's own reckoning)."""

ENQUEUE = """
WITH input AS (
    SELECT b, ord FROM unnest(%(items)b::bytea[]) WITH ORDINALITY AS u(b, ord)
), fresh AS (
    SELECT b, row_number() OVER (ORDER BY ord) AS rn FROM input
    -- One index probe per input item. Not NOT EXISTS: the planner turns that
    -- into an anti join and, with the fresh table's stale statistics, hashes
    -- every item of the queue for each batch (an enqueue of 1M items then
    -- reads ~25M rows; a re-enqueue ~50M). A scalar subquery stays a probe.
    WHERE (
        SELECT true FROM statequeue.items i
        WHERE i.queue = %(q)s AND i.key = sha256(input.b) LIMIT 1
    ) IS NULL
), ins AS (
    INSERT INTO statequeue.items (queue, id, item)
    SELECT %(q)s, %(first)s + rn - 1, b FROM fresh
    RETURNING id
), hot AS (
    INSERT INTO statequeue.live (queue, id, state) SELECT %(q)s, id, 'pending' FROM ins
)
SELECT count(*) FROM ins
"""

ROLL_UP_COUNTS = """
WITH gone AS (
    DELETE FROM statequeue.count_deltas WHERE queue = %(q)s RETURNING state, delta
), summed AS (
    SELECT state, sum(delta) AS n FROM gone GROUP BY state
)
INSERT INTO statequeue.counts (queue, state, n) SELECT %(q)s, state, n FROM summed
ON CONFLICT (queue, state) DO UPDATE SET n = statequeue.counts.n + excluded.n
"""

COUNTS = """
SELECT state, sum(n)::bigint FROM (
    SELECT state, n FROM statequeue.counts WHERE queue = %(q)s
    UNION ALL SELECT state, delta FROM statequeue.count_deltas WHERE queue = %(q)s
) c GROUP BY state
"""

RUNNER_ALIVE = (
    "r.stopped_at IS NULL AND r.seen_at + make_interval(secs => r.lease) > clock_timestamp()"
)
"""A runner is alive while its heartbeat keeps ``seen_at`` within its lease."""

ACTIVE_RUNNERS = f"""
SELECT r.runner_id, r.pid, r.host, r.since, ARRAY(
    SELECT l.id FROM statequeue.live l
    WHERE l.queue = r.queue AND l.runner = r.runner_id AND l.state = 'running' ORDER BY l.id
)
FROM statequeue.runners r
WHERE r.queue = %(q)s AND {RUNNER_ALIVE}
ORDER BY r.since, r.runner_id
"""

# One statement renews every lease a store holds (and its runners' rows);
# an expired lease is never revived: a reaper may be about to take it.
RENEW = f"""
WITH seen AS (
    UPDATE statequeue.runners SET seen_at = clock_timestamp()
    WHERE queue = %(q)s AND runner_id = ANY(%(runners)s::text[]) AND stopped_at IS NULL
)
UPDATE statequeue.live SET lease_until = {LEASE}
WHERE queue = %(q)s AND token = ANY(%(tokens)s::bigint[]) AND state = 'running'
  AND lease_until > clock_timestamp()
RETURNING token
"""

# One reaper at a time: whoever moves last_reap_at forward reaps; the others
# find it moved within the interval and skip.
REAP_TURN = """
UPDATE statequeue.queues SET last_reap_at = clock_timestamp()
WHERE name = %(q)s
  AND (last_reap_at IS NULL OR last_reap_at < clock_timestamp() - make_interval(secs => %(every)s))
RETURNING 1
"""

# Locked rows are skipped (their holder is finishing or renewing them); the
# lease is checked on the row as locked, so a renew that committed first wins.
EXPIRED = """
SELECT l.id, l.attempts, l.crashes FROM statequeue.live l
WHERE l.queue = %(q)s AND l.state = 'running' AND l.lease_until < clock_timestamp()
ORDER BY l.id
FOR UPDATE SKIP LOCKED
"""

# Items held by runners of this host and boot, for the same-host shortcut
# (their pids are checked here, by the caller).
SAME_HOST = """
SELECT l.id, l.token, r.pid FROM statequeue.live l
JOIN statequeue.runners r ON r.queue = l.queue AND r.runner_id = l.runner
WHERE l.queue = %(q)s AND l.state = 'running' AND r.host = %(host)s AND r.boot = %(boot)s
ORDER BY l.id
"""

SAME_HOST_RUNNERS = """
SELECT runner_id, pid FROM statequeue.runners
WHERE queue = %(q)s AND stopped_at IS NULL AND host = %(host)s AND boot = %(boot)s
"""

ONE_HELD = """
SELECT l.id, l.attempts, l.crashes FROM statequeue.live l
WHERE l.queue = %(q)s AND l.id = %(id)s AND l.token = %(token)s AND l.state = 'running'
FOR UPDATE SKIP LOCKED
"""

LOST_RUNNERS = f"""
UPDATE statequeue.runners r SET stopped_at = %(now)s
WHERE r.queue = %(q)s AND r.stopped_at IS NULL AND NOT ({RUNNER_ALIVE})
RETURNING r.runner_id
"""

INTERRUPTED = """
SELECT l.id FROM statequeue.live l
WHERE l.queue = %(q)s AND l.state = 'running' AND l.lease_until < clock_timestamp()
ORDER BY l.id
"""

ITEMS_PAGE = """
SELECT i.id, i.item, coalesce(l.state, i.state), coalesce(l.attempts, i.attempts),
       coalesce(l.reason, i.reason)
FROM statequeue.items i
LEFT JOIN statequeue.live l ON l.queue = i.queue AND l.id = i.id
WHERE i.queue = %(q)s AND i.id > %(after)s
  AND (%(state)s::text IS NULL OR coalesce(l.state, i.state) = %(state)s::text)
ORDER BY i.id LIMIT %(limit)s
"""

_RESULT_FIELDS = "queue, id, token, state, attempt, exit_code, duration, reason, result"

# Results of items compacted into the archive are read from there (``archived``).
RESULTS_PAGE = f"""
SELECT DISTINCT ON (r.id) r.id, i.item, r.state, r.attempt, r.exit_code, r.duration,
       r.reason, r.result, coalesce(l.state, i.state) AS current, r.archived
FROM (
    SELECT {_RESULT_FIELDS}, false AS archived FROM statequeue.results
    WHERE queue = %(q)s AND id > %(after)s AND id <= %(upto)s
    UNION ALL
    SELECT {_RESULT_FIELDS}, true FROM statequeue.archived_results
    WHERE queue = %(q)s AND id > %(after)s AND id <= %(upto)s
) r
JOIN statequeue.items i ON i.queue = r.queue AND i.id = r.id
LEFT JOIN statequeue.live l ON l.queue = r.queue AND l.id = r.id
ORDER BY r.id, r.token DESC
"""

ITEM_EVENTS = """
SELECT seq, body FROM (
    SELECT seq, body FROM statequeue.events WHERE queue = %(q)s AND id = %(id)s
    UNION ALL
    SELECT seq, body FROM statequeue.archived_events WHERE queue = %(q)s AND id = %(id)s
) e WHERE body->>'t' <> 'enq' ORDER BY seq
"""

LAST_RESULT = """
SELECT result, err FROM (
    SELECT token, result, err FROM statequeue.results WHERE queue = %(q)s AND id = %(id)s
    UNION ALL
    SELECT token, result, err FROM statequeue.archived_results WHERE queue = %(q)s AND id = %(id)s
) r ORDER BY token DESC LIMIT 1
"""
