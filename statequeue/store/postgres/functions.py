"""Server-side functions for the hot path: one round trip per claim, finish
or finish-and-claim (schema version 5).

Measured with ``log_statement = all``: a claim and a finish cost 12.15
statements per item (BEGIN, the claim, COMMIT; BEGIN, the fencing SELECT ...
FOR UPDATE, the result, the hot-table delete, the item update, two count
deltas, the event, COMMIT), each a round trip, where the floor (a bare SKIP
LOCKED claim and a finish) sends 2. Each function below runs as one
autocommit statement: its own transaction, one round trip, one commit.

The promises are the statements' as before:
- fencing: the hot-table row is changed only while it holds the claim's
  token (``token = p_token AND state = 'running'``, re-checked on the locked
  row under READ COMMITTED); a stale finish returns NULL and writes nothing;
- one result per token (``results``' key); a finish retried after a lost
  acknowledgement (``p_retried``) returns the state already recorded, in
  ``results`` or ``archived_results``;
- ``p_sync = false`` lowers ``synchronous_commit`` for this transaction only
  (group commit), as ``SET LOCAL`` did.

The SQL is spelt out here (not built from sql.py) because a migration is
frozen once released: a later change is a new migration replacing a function.
"""

from __future__ import annotations

# One statement: pick the lowest-id due pending item (the CTE is MATERIALIZED
# so the planner cannot run the LIMIT subquery twice), claim it with a new
# fencing token, count it and record its start.
_CLAIM = """
CREATE FUNCTION statequeue.claim(
    p_queue text, p_now float8, p_runner text, p_lease float8, p_among bigint[]
) RETURNS TABLE (
    id bigint, item bytea, attempts integer, token bigint, interrupted boolean, failures integer
) LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
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
    ), counted AS (
        INSERT INTO statequeue.count_deltas (queue, state, delta)
        SELECT p_queue, x.state, x.delta
        FROM claimed, (VALUES ('pending', -1), ('running', 1)) x(state, delta)
    ), started AS (
        INSERT INTO statequeue.events (queue, id, body)
        SELECT p_queue, c.id, jsonb_build_object(
            't', 'start', 'id', c.id, 'attempt', c.attempts, 'runner', p_runner,
            'at', p_now
        ) FROM claimed c
    )
    SELECT c.id, i.item, c.attempts, c.token, c.interrupted, c.failures
    FROM claimed c JOIN statequeue.items i ON i.queue = p_queue AND i.id = c.id;
END
$fn$;
"""

# The finish: fenced change of the hot-table row (done leaves it), the
# result, the item's final state, the count deltas and the end event. NULL:
# the token is stale, nothing was written.
_FINISH = """
CREATE FUNCTION statequeue.finish(
    p_queue text, p_id bigint, p_token bigint, p_attempt integer, p_state text,
    p_ok boolean, p_exit integer, p_signal integer, p_duration float8, p_reason text,
    p_result jsonb, p_err text, p_retry_at float8, p_at float8, p_event jsonb,
    p_sync boolean, p_retried boolean
) RETURNS text LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    recorded text;
BEGIN
    IF NOT p_sync THEN
        PERFORM set_config('synchronous_commit', 'off', true);  -- this transaction only
    END IF;
    IF p_retried THEN
        -- The first try may have committed (only its acknowledgement lost):
        -- one result per token, so the recorded one is the answer.
        SELECT r.state INTO recorded FROM (
            SELECT state FROM statequeue.results WHERE token = p_token
            UNION ALL SELECT state FROM statequeue.archived_results WHERE token = p_token
        ) r LIMIT 1;
        IF recorded IS NOT NULL THEN
            RETURN recorded;
        END IF;
    END IF;
    IF p_state = 'done' THEN
        DELETE FROM statequeue.live l
        WHERE l.queue = p_queue AND l.id = p_id AND l.token = p_token AND l.state = 'running';
    ELSE
        UPDATE statequeue.live l
        SET state = p_state, retry_at = p_retry_at, token = NULL, runner = NULL,
            holder = NULL, lease_until = NULL, failures = l.failures + 1,
            interrupted = false, reason = p_reason, last_err = p_err, changed_at = p_at
        WHERE l.queue = p_queue AND l.id = p_id AND l.token = p_token AND l.state = 'running';
    END IF;
    IF NOT FOUND THEN
        RETURN NULL;  -- stale: taken over, or finished already
    END IF;
    INSERT INTO statequeue.results (token, queue, id, attempt, state, ok, exit_code,
        signal, duration, reason, result, err, at)
    VALUES (p_token, p_queue, p_id, p_attempt, p_state, p_ok, p_exit, p_signal,
        p_duration, p_reason, p_result, p_err, p_at);
    IF p_state = 'done' THEN
        UPDATE statequeue.items i SET state = 'done', attempts = p_attempt, reason = p_reason
        WHERE i.queue = p_queue AND i.id = p_id;
    END IF;
    INSERT INTO statequeue.count_deltas (queue, state, delta)
    VALUES (p_queue, 'running', -1), (p_queue, p_state, 1);
    INSERT INTO statequeue.events (queue, id, body) VALUES (p_queue, p_id, p_event);
    RETURN p_state;
END
$fn$;
"""

# Finish one item and claim the next in one transaction (one commit). A
# stale finish claims nothing. When a retried call finds its result already
# recorded, the first try's claim committed too: it is found by its runner
# and the exact ``changed_at`` the claim wrote (this call's ``p_now``) and
# handed back with a renewed lease, so it is neither claimed twice nor left
# to expire as an interrupted attempt.
_FINISH_AND_CLAIM = """
CREATE FUNCTION statequeue.finish_and_claim(
    p_queue text, p_id bigint, p_token bigint, p_attempt integer, p_state text,
    p_ok boolean, p_exit integer, p_signal integer, p_duration float8, p_reason text,
    p_result jsonb, p_err text, p_retry_at float8, p_at float8, p_event jsonb,
    p_retried boolean, p_now float8, p_runner text, p_lease float8, p_among bigint[]
) RETURNS TABLE (
    state text, id bigint, item bytea, attempts integer, token bigint,
    interrupted boolean, failures integer
) LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict use_column
DECLARE
    finished text;
    adopted bigint;
BEGIN
    finished := statequeue.finish(p_queue, p_id, p_token, p_attempt, p_state, p_ok, p_exit,
        p_signal, p_duration, p_reason, p_result, p_err, p_retry_at, p_at, p_event,
        true, p_retried);
    IF finished IS NULL THEN
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
        IF adopted IS NOT NULL THEN
            RETURN QUERY SELECT finished, l.id, i.item, l.attempts, l.token, l.interrupted,
                l.failures
            FROM statequeue.live l JOIN statequeue.items i ON i.queue = l.queue AND i.id = l.id
            WHERE l.queue = p_queue AND l.id = adopted;
            RETURN;
        END IF;
    END IF;
    RETURN QUERY SELECT finished, c.* FROM statequeue.claim(p_queue, p_now, p_runner, p_lease,
        p_among) c;
    IF NOT FOUND THEN
        RETURN QUERY SELECT finished, NULL::bigint, NULL::bytea, NULL::integer, NULL::bigint,
            NULL::boolean, NULL::integer;
    END IF;
END
$fn$;
"""

# A finished attempt's output, fenced like finish, committed asynchronously
# (the finish that follows commits synchronously and flushes it too). True
# when stored now or by an earlier call with the same token.
_SAVE_LOG = """
CREATE FUNCTION statequeue.save_log(
    p_queue text, p_id bigint, p_attempt integer, p_token bigint, p_data bytea, p_at float8
) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO statequeue.logs (queue, id, attempt, token, data, at)
    SELECT l.queue, l.id, p_attempt, l.token, p_data, p_at FROM statequeue.live l
    WHERE l.queue = p_queue AND l.id = p_id AND l.token = p_token AND l.state = 'running'
    ON CONFLICT (queue, id, attempt) DO NOTHING;
    IF FOUND THEN
        RETURN true;
    END IF;
    RETURN EXISTS (
        SELECT 1 FROM statequeue.logs g
        WHERE g.queue = p_queue AND g.id = p_id AND g.attempt = p_attempt AND g.token = p_token
    );
END
$fn$;
"""

V5_FUNCTIONS = _CLAIM + _FINISH + _FINISH_AND_CLAIM + _SAVE_LOG

# Schema version 6: each function resolves names with its own search_path,
# never the caller's. Every table, sequence and function above is named with
# its schema already; what the pin closes is the rest (operators, casts and
# built-in functions such as ``make_interval``), which a role that may create
# objects in a schema on the caller's search_path (``public``, before
# PostgreSQL 15, for everyone) could otherwise shadow with its own, run with
# the caller's rights. pg_temp comes last, explicitly: left out, it would be
# searched first.
_FINISH_TYPES = """text, bigint, bigint, integer, text, boolean, integer, integer,
    float8, text, jsonb, text, float8, float8, jsonb"""
PINNED_PATH = "pg_catalog, pg_temp"
V6_PINNED_PATH = f"""
ALTER FUNCTION statequeue.claim(text, float8, text, float8, bigint[])
    SET search_path = {PINNED_PATH};
ALTER FUNCTION statequeue.finish({_FINISH_TYPES}, boolean, boolean)
    SET search_path = {PINNED_PATH};
ALTER FUNCTION statequeue.finish_and_claim({_FINISH_TYPES}, boolean, float8, text, float8,
    bigint[]) SET search_path = {PINNED_PATH};
ALTER FUNCTION statequeue.save_log(text, bigint, integer, bigint, bytea, float8)
    SET search_path = {PINNED_PATH};
"""

CLAIM = """
SELECT * FROM statequeue.claim(%(q)s::text, %(now)s::float8, %(runner)s::text,
    %(lease)s::float8, %(among)s::bigint[])
"""

_FINISH_ARGS = """%(q)s::text, %(id)s::bigint, %(token)s::bigint, %(attempt)s::integer,
    %(state)s::text, %(ok)s::boolean, %(exit)s::integer, %(signal)s::integer,
    %(duration)s::float8, %(reason)s::text, %(result)s::jsonb, %(err)s::text,
    %(retry_at)s::float8, %(at)s::float8, %(event)s::jsonb"""

FINISH = f"""
SELECT statequeue.finish({_FINISH_ARGS}, %(sync)s::boolean, %(retried)s::boolean)
"""

FINISH_AND_CLAIM = f"""
SELECT * FROM statequeue.finish_and_claim({_FINISH_ARGS}, %(retried)s::boolean,
    %(now)s::float8, %(runner)s::text, %(lease)s::float8, %(among)s::bigint[])
"""

SAVE_LOG = """
SELECT statequeue.save_log(%(q)s::text, %(id)s::bigint, %(attempt)s::integer,
    %(token)s::bigint, %(data)s::bytea, %(at)s::float8)
"""
