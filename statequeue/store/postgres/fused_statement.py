"""Schema version 13: a finish in one statement, and its count folded into
the next claim's (issue 21 point 14).

Measured at 16 loops of ``Queue.work()`` on 2 CPUs: the loops and the server
are CPU-bound together, and a profile of the server showed most of its time
in what every statement costs before and after its rows (the executor's
set-up, memory contexts, plan-cache checks, a snapshot), not in the rows.
Version 7's ``finish_and_claim`` ran six statements per item inside the
function: the hot-table delete (or update), the result, the item's state,
the end event, the claim (one statement already: the pick, the update, the
start event) and the count. It now runs two: the finish, as data-modifying
CTEs of one statement, and the claim with the count.

The promises are the same, each kept by the same SQL:

- fencing: the running row is deleted (done) or updated (any other end)
  only while it holds the token; ``hit`` is that row, and every other write
  of the finish reads it, so a stale token writes nothing, and claims
  nothing;
- one result per token (``results``' key);
- the count: one row per move, as version 7 writes it.

The claim stays a statement of its own, with a snapshot of its own taken
after the finish: in the finish's statement, its pick ran on a snapshot
older by the finish, and under 16 loops it met rows that other loops had
claimed since, whose newer versions it then locked (READ COMMITTED re-checks
the newest version of a row, locking it, and keeps the lock when the check
fails), holding up those loops' finishes till it committed: ~5% of the
backends' time was spent so, against ~1% before, and it ran slower.

A retried call (``p_retried``: the first try may have committed, its answer
lost) takes version 11's path unchanged: that function is kept, renamed
``finish_and_claim_retried``, and called from here. The finish and claim
functions of version 11 are unchanged; the signature and result of
``finish_and_claim`` are too (callers' SQL in functions.py). The claim's
CTEs are version 7's text (lean_writes.py, frozen); the rest is spelt out
here, as a migration is frozen once released.
"""

from __future__ import annotations

from statequeue.store.postgres.functions import PINNED_PATH
from statequeue.store.postgres.lean_writes import V7_TAKING

# Version 7's claim (pick, update, start event), as data-modifying CTEs
# without its final SELECT: the count joins them here, and the claim is
# returned with the finish's state.
_CLAIMING, _CUT, _ = V7_TAKING.partition("\n    SELECT FIRST ")
if not _CUT or _CLAIMING.count("WITH pick AS MATERIALIZED") != 1:
    raise AssertionError("version 7's claim is not shaped as version 13 expects")

_ARGS = """p_queue text, p_id bigint, p_token bigint, p_attempt integer, p_state text,
    p_ok boolean, p_exit integer, p_signal integer, p_duration float8, p_reason text,
    p_result jsonb, p_err text, p_retry_at float8, p_at float8, p_event jsonb,
    p_retried boolean, p_now float8, p_runner text, p_lease float8, p_among bigint[]"""

_TYPES = """text, bigint, bigint, integer, text, boolean, integer, integer, float8, text,
    jsonb, text, float8, float8, jsonb, boolean, float8, text, float8, bigint[]"""

V13_FUSED_STATEMENT = f"""
ALTER FUNCTION statequeue.finish_and_claim({_TYPES}) RENAME TO finish_and_claim_retried;

CREATE FUNCTION statequeue.finish_and_claim({_ARGS})
RETURNS TABLE (
    state text, id bigint, item bytea, attempts integer, token bigint,
    interrupted boolean, failures integer
) LANGUAGE plpgsql VOLATILE SET search_path = {PINNED_PATH} AS $fn$
#variable_conflict use_column
DECLARE
    fresh boolean;
BEGIN
    IF p_retried THEN
        RETURN QUERY SELECT * FROM statequeue.finish_and_claim_retried(p_queue, p_id,
            p_token, p_attempt, p_state, p_ok, p_exit, p_signal, p_duration, p_reason,
            p_result, p_err, p_retry_at, p_at, p_event, p_retried, p_now, p_runner, p_lease,
            p_among);
        RETURN;
    END IF;
    WITH gone AS (
        DELETE FROM statequeue.live l
        WHERE p_state = 'done' AND l.queue = p_queue AND l.id = p_id
          AND l.token = p_token AND l.state = 'running'
        RETURNING l.id
    ), kept AS (
        UPDATE statequeue.live l
        SET state = p_state, retry_at = p_retry_at, token = NULL, runner = NULL,
            holder = NULL, lease_until = NULL, failures = l.failures + 1,
            interrupted = false, reason = p_reason, last_err = p_err, changed_at = p_at
        WHERE p_state <> 'done' AND l.queue = p_queue AND l.id = p_id
          AND l.token = p_token AND l.state = 'running'
        RETURNING l.id
    ), hit AS MATERIALIZED (
        SELECT g.id FROM gone g UNION ALL SELECT k.id FROM kept k
    ), resulted AS (
        INSERT INTO statequeue.results (token, queue, id, attempt, state, ok, exit_code,
            signal, duration, reason, result, err, at)
        SELECT p_token, p_queue, p_id, p_attempt, p_state, p_ok, p_exit, p_signal,
            p_duration, p_reason, p_result, p_err, p_at FROM hit
    ), settled AS (
        UPDATE statequeue.items i SET state = 'done', attempts = p_attempt, reason = p_reason
        FROM hit WHERE p_state = 'done' AND i.queue = p_queue AND i.id = p_id
    ), ended AS (
        INSERT INTO statequeue.events (queue, id, body) SELECT p_queue, p_id, p_event FROM hit
    )
    SELECT count(*) > 0 INTO fresh FROM hit;
    IF NOT fresh THEN
        RETURN QUERY SELECT NULL::text, NULL::bigint, NULL::bytea, NULL::integer,
            NULL::bigint, NULL::boolean, NULL::integer;
        RETURN;
    END IF;
    RETURN QUERY
    {_CLAIMING.strip()}, counted AS (
        -- The finished item moves from running to its state, the taken one
        -- from pending to running: one move, pending (or running) to the state.
        INSERT INTO statequeue.count_moves (queue, state, delta, moved_from)
        SELECT p_queue, p_state, 1, m.moved_from
        FROM (SELECT CASE WHEN EXISTS (SELECT 1 FROM claimed) THEN 'pending'
                ELSE 'running' END AS moved_from) m
        WHERE m.moved_from <> p_state
    )
    SELECT p_state, c.id, i.item, c.attempts, c.token, c.interrupted, c.failures
    FROM (SELECT 1) one
    LEFT JOIN (claimed c JOIN statequeue.items i ON i.queue = p_queue AND i.id = c.id) ON true;
END
$fn$;
"""
