"""Schema version 7: fewer writes per item (issue 21 point 14).

Measured with scripts/probe_pg_statements.py at 16 loops of ``Queue.work()``:
the server wrote ~34 WAL records (~2.9 KB) per item against the psycopg
floor's ~8 (~520 B), and at 16 loops the WAL flush and the server's CPU are
what both wait for. Most of the records were index inserts no read needed:

- ``live_token`` and ``live_lease``: every claim inserted into both. Leases
  are renewed and reaped among the queue's running rows (``live_state``
  finds them: a handful per runner), and fencing reads the row by its key
  and compares the token. Without them a renewal (only ``lease_until``
  changes) is a HOT update too.
- ``events_queue``: the event feed reads by transaction (``events_xid``),
  history by item (``events_item``); both lead with the queue, so `drop`'s
  batches still find a queue's rows by index.
- ``results``: a primary key on the token beside an index on (queue, id,
  token). One key on (queue, id, token) serves both: the token comes from
  a sequence, so it is unique by itself, and a token's finish always names
  its item (one result per token still holds).
- ``results_at``: a btree on the finish time, read only for the recent
  ones (the rate in `status`, `stats --since`). Results are appended in time
  order, so a BRIN index serves those reads (the newest pages are not yet
  summarized and are read as they are: the recent rows) and an insert into
  them writes nothing to it; ``autosummarize`` summarizes each filled range.
- ``events``' primary key on ``seq``: no read looks an event up by it (the
  feed reads by xid, history and archive by item) and ``seq`` comes from
  its sequence, so it is unique without an index to say so. The archive's
  copy (``archived_events``) keeps its key.
- ``items``: a done item's row was updated out of place (a new row version
  and three index inserts: the key, the sha256 key, ``items_to_archive``),
  because that index's predicate names ``state``. Compaction now finds its
  candidates through ``items_unarchived`` (every item not yet archived, in
  id order, its state checked on the row), so no index names a column the
  finish changes, and a fifth of each new page is left free: the finish is a
  HOT update (same page, no index insert). The price: a compaction walks
  the unfinished items too (it is run by hand; a queue of 1M pending items
  adds about a second to it).

And the count deltas: a fused finish-and-claim wrote four rows (the
finished item running -1 and its state +1; the next pending -1 and running
+1), of which two cancel, and each was deleted again by the roll-up. The
functions now write to ``count_moves``, a row per move of an item between
states (``moved_from`` loses what ``state`` gains), so a claim, a finish, or
a finish and the claim it chains to (pending to done) is one row. A table
of its own, not a column of ``count_deltas``: a runner of the version before
still at work while the schema moves on folds ``count_deltas`` as it always
did, and a row it does not understand there would corrupt ``counts`` for
good. The user's actions and enqueues still write ``count_deltas``.

The public functions keep their signatures (the callers' SQL in
functions.py is unchanged) and their search_path stays pinned (version 6).
They are built from two pieces of text, the finish without its count
(``_SETTLING``) and the claim without its count (``_TAKING``), spliced into
each function rather than called as functions of their own: a call of a
function with a pinned search_path switches the setting twice, and the
fused path would pay two more of those per item. The SQL is spelt out here:
a migration is frozen once released.
"""

from __future__ import annotations

from statequeue.store.postgres.functions import PINNED_PATH

_INDEXES = """
DROP INDEX statequeue.live_token;
DROP INDEX statequeue.live_lease;
DROP INDEX statequeue.events_queue;
ALTER TABLE statequeue.results DROP CONSTRAINT results_pkey;
DROP INDEX statequeue.results_item;
ALTER TABLE statequeue.results ADD PRIMARY KEY (queue, id, token);
DROP INDEX statequeue.results_at;
CREATE INDEX results_at ON statequeue.results USING brin (at) WITH (autosummarize = on);
ALTER TABLE statequeue.events DROP CONSTRAINT events_pkey;
DROP INDEX statequeue.items_to_archive;
CREATE INDEX items_unarchived ON statequeue.items (queue, id) WHERE NOT archived;
ALTER TABLE statequeue.items SET (fillfactor = 80);
-- One row per move: state gains delta, moved_from loses it (sql.COUNTS).
CREATE TABLE statequeue.count_moves (
    queue text NOT NULL,
    state text NOT NULL,
    moved_from text NOT NULL,
    delta bigint NOT NULL
);
"""

# A finish without its count, as a block of a function that declares
# ``recorded text`` (the item's state; NULL: the token is stale, nothing
# written) and ``fresh boolean`` (written now; false: a retried call found
# the first try's result). Columns are always qualified: the functions'
# output columns share their names.
_SETTLING = """
    fresh := false;
    <<settling>>
    BEGIN
        IF p_retried THEN
            -- The first try may have committed (only its acknowledgement
            -- lost): one result per token, so the recorded one is the answer.
            SELECT r.st INTO recorded FROM (
                SELECT x.state AS st FROM statequeue.results x
                WHERE x.queue = p_queue AND x.id = p_id AND x.token = p_token
                UNION ALL SELECT a.state FROM statequeue.archived_results a
                WHERE a.token = p_token
            ) r LIMIT 1;
            IF recorded IS NOT NULL THEN
                EXIT settling;
            END IF;
        END IF;
        IF p_state = 'done' THEN
            DELETE FROM statequeue.live l
            WHERE l.queue = p_queue AND l.id = p_id AND l.token = p_token
              AND l.state = 'running';
        ELSE
            UPDATE statequeue.live l
            SET state = p_state, retry_at = p_retry_at, token = NULL, runner = NULL,
                holder = NULL, lease_until = NULL, failures = l.failures + 1,
                interrupted = false, reason = p_reason, last_err = p_err, changed_at = p_at
            WHERE l.queue = p_queue AND l.id = p_id AND l.token = p_token
              AND l.state = 'running';
        END IF;
        IF NOT FOUND THEN
            EXIT settling;  -- stale: taken over, or finished already
        END IF;
        INSERT INTO statequeue.results (token, queue, id, attempt, state, ok, exit_code,
            signal, duration, reason, result, err, at)
        VALUES (p_token, p_queue, p_id, p_attempt, p_state, p_ok, p_exit, p_signal,
            p_duration, p_reason, p_result, p_err, p_at);
        IF p_state = 'done' THEN
            UPDATE statequeue.items i SET state = 'done', attempts = p_attempt,
                reason = p_reason
            WHERE i.queue = p_queue AND i.id = p_id;
        END IF;
        INSERT INTO statequeue.events (queue, id, body) VALUES (p_queue, p_id, p_event);
        recorded := p_state;
        fresh := true;
    END;
"""

# A claim without its count, as a query: the lowest-id due pending item
# (the CTE is MATERIALIZED so the planner cannot run the LIMIT subquery
# twice), with a new fencing token and a lease, and its start event. FIRST
# is replaced by the columns that come before the claim's in the result (a
# query with a data-modifying WITH cannot be a subquery).
_TAKING = """
    WITH pick AS MATERIALIZED (
        SELECT l.id FROM statequeue.live l
        WHERE l.queue = p_queue AND l.state = 'pending'
          AND (l.retry_at IS NULL OR l.retry_at <= p_now)
          AND (p_among IS NULL OR l.id = ANY(p_among))
          AND NOT (SELECT q.paused FROM statequeue.queues q WHERE q.name = p_queue)
        ORDER BY l.id LIMIT 1
        FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE statequeue.live l
        SET state = 'running', attempts = l.attempts + 1,
            token = nextval('statequeue.tokens'), runner = p_runner, holder = NULL,
            lease_until = clock_timestamp() + make_interval(secs => p_lease),
            retry_at = NULL, changed_at = p_now
        FROM pick WHERE l.queue = p_queue AND l.id = pick.id
        RETURNING l.id, l.attempts, l.token, l.interrupted, l.failures
    ), started AS (
        INSERT INTO statequeue.events (queue, id, body)
        SELECT p_queue, c.id, jsonb_build_object(
            't', 'start', 'id', c.id, 'attempt', c.attempts, 'runner', p_runner,
            'at', p_now
        ) FROM claimed c
    )
    SELECT FIRST c.id, i.item, c.attempts, c.token, c.interrupted, c.failures
    FROM claimed c JOIN statequeue.items i ON i.queue = p_queue AND i.id = c.id
"""

_CLAIM = f"""
CREATE OR REPLACE FUNCTION statequeue.claim(
    p_queue text, p_now float8, p_runner text, p_lease float8, p_among bigint[]
) RETURNS TABLE (
    id bigint, item bytea, attempts integer, token bigint, interrupted boolean, failures integer
) LANGUAGE plpgsql VOLATILE SET search_path = {PINNED_PATH} AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY {_TAKING.replace("FIRST ", "")};
    IF FOUND THEN
        INSERT INTO statequeue.count_moves (queue, state, delta, moved_from)
        VALUES (p_queue, 'running', 1, 'pending');
    END IF;
END
$fn$;
"""

_FINISH = f"""
CREATE OR REPLACE FUNCTION statequeue.finish(
    p_queue text, p_id bigint, p_token bigint, p_attempt integer, p_state text,
    p_ok boolean, p_exit integer, p_signal integer, p_duration float8, p_reason text,
    p_result jsonb, p_err text, p_retry_at float8, p_at float8, p_event jsonb,
    p_sync boolean, p_retried boolean
) RETURNS text LANGUAGE plpgsql VOLATILE SET search_path = {PINNED_PATH} AS $fn$
DECLARE
    recorded text;
    fresh boolean;
BEGIN
    IF NOT p_sync THEN
        PERFORM set_config('synchronous_commit', 'off', true);  -- this transaction only
    END IF;
    {_SETTLING}
    IF fresh THEN
        INSERT INTO statequeue.count_moves (queue, state, delta, moved_from)
        VALUES (p_queue, p_state, 1, 'running');
    END IF;
    RETURN recorded;
END
$fn$;
"""

# As in version 5 (functions.py), but the finish and the next claim are
# counted together, as one move.
_FINISH_AND_CLAIM = f"""
CREATE OR REPLACE FUNCTION statequeue.finish_and_claim(
    p_queue text, p_id bigint, p_token bigint, p_attempt integer, p_state text,
    p_ok boolean, p_exit integer, p_signal integer, p_duration float8, p_reason text,
    p_result jsonb, p_err text, p_retry_at float8, p_at float8, p_event jsonb,
    p_retried boolean, p_now float8, p_runner text, p_lease float8, p_among bigint[]
) RETURNS TABLE (
    state text, id bigint, item bytea, attempts integer, token bigint,
    interrupted boolean, failures integer
) LANGUAGE plpgsql VOLATILE SET search_path = {PINNED_PATH} AS $fn$
#variable_conflict use_column
DECLARE
    recorded text;
    fresh boolean;
    adopted bigint;
    took boolean := false;
    moved_from text;
    moved_to text;
BEGIN
    {_SETTLING}
    IF recorded IS NULL THEN
        RETURN QUERY SELECT NULL::text, NULL::bigint, NULL::bytea, NULL::integer,
            NULL::bigint, NULL::boolean, NULL::integer;
        RETURN;
    END IF;
    IF p_retried THEN
        UPDATE statequeue.live l
        SET lease_until = clock_timestamp() + make_interval(secs => p_lease)
        WHERE l.queue = p_queue AND l.runner = p_runner AND l.state = 'running'
          AND l.changed_at = p_now AND l.lease_until > clock_timestamp()
        RETURNING l.id INTO adopted;
    END IF;
    IF adopted IS NOT NULL THEN
        RETURN QUERY SELECT recorded, l.id, i.item, l.attempts, l.token, l.interrupted,
            l.failures
        FROM statequeue.live l JOIN statequeue.items i ON i.queue = l.queue AND i.id = l.id
        WHERE l.queue = p_queue AND l.id = adopted;
    ELSE
        RETURN QUERY {_TAKING.replace("FIRST ", "recorded, ")};
        took := FOUND;
        IF NOT took THEN
            RETURN QUERY SELECT recorded, NULL::bigint, NULL::bytea, NULL::integer,
                NULL::bigint, NULL::boolean, NULL::integer;
        END IF;
    END IF;
    -- The finished item moves from running to its state (when written
    -- now), the taken one from pending to running: one move, from pending
    -- (or running) to the state (or running), when they chain.
    IF fresh OR took THEN
        moved_from := CASE WHEN took THEN 'pending' ELSE 'running' END;
        moved_to := CASE WHEN fresh THEN p_state ELSE 'running' END;
        IF moved_from <> moved_to THEN
            INSERT INTO statequeue.count_moves (queue, state, delta, moved_from)
            VALUES (p_queue, moved_to, 1, moved_from);
        END IF;
    END IF;
END
$fn$;
"""

V7_LEAN_WRITES = _INDEXES + _CLAIM + _FINISH + _FINISH_AND_CLAIM

# Version 11 (settle_retry.py) replaces these two, from this text.
V7_FINISH = _FINISH
V7_FINISH_AND_CLAIM = _FINISH_AND_CLAIM
# Version 13 (fused_statement.py) builds its claim from this one.
V7_TAKING = _TAKING
