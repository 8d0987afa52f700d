"""The PostgreSQL schema, as numbered migrations applied under an advisory lock.

Each migration runs in the transaction that records its number, so a crash
leaves the schema at one version or the next, never between. A database whose
recorded version is newer than ``MIGRATIONS`` knows is refused: this code
would misread tables it does not know.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from statequeue.core.errors import SchemaTooNew
from statequeue.store.postgres import lock_holders
from statequeue.store.postgres.check_marks import V12_CHECKS
from statequeue.store.postgres.functions import V5_FUNCTIONS, V6_PINNED_PATH
from statequeue.store.postgres.fused_statement import V13_FUSED_STATEMENT
from statequeue.store.postgres.lean_writes import V7_LEAN_WRITES
from statequeue.store.postgres.owners import check_owners
from statequeue.store.postgres.settle_retry import V11_SETTLE_RETRY

if TYPE_CHECKING:
    from statequeue.store.postgres.connection import Connection

LOCK_CLASS = 1936810353
"""First key of every advisory lock statequeue takes (the second names what is locked)."""
MIGRATION_LOCK = 0
"""Second key of the lock that serialises migrations (schema version 1 also
used keys 1 and up for per-connection liveness; leases replaced them)."""

_V1 = """
CREATE SCHEMA IF NOT EXISTS statequeue;
CREATE TABLE statequeue.queues (
    name text PRIMARY KEY,
    paused boolean NOT NULL DEFAULT false,
    next_id bigint NOT NULL DEFAULT 1,
    created_at timestamptz NOT NULL DEFAULT now()
);
-- Every item ever enqueued. ``state`` is authoritative once the item left the
-- hot table (done or cancelled); until then ``live`` holds its state.
CREATE TABLE statequeue.items (
    queue text NOT NULL,
    id bigint NOT NULL,
    item bytea NOT NULL,
    key bytea GENERATED ALWAYS AS (sha256(item)) STORED,
    state text NOT NULL DEFAULT 'pending',
    attempts integer NOT NULL DEFAULT 0,
    reason text NOT NULL DEFAULT '',
    PRIMARY KEY (queue, id)
);
-- Exact dedupe over the bytes: a plain unique index on a long bytea would
-- exceed the btree row limit, its sha256 does not.
CREATE UNIQUE INDEX items_key ON statequeue.items (queue, key);
-- The hot table: unfinished items only, so claims never walk history.
-- token and lease_until are the claim's fence and lease (leases: step 2).
CREATE TABLE statequeue.live (
    queue text NOT NULL,
    id bigint NOT NULL,
    state text NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    crashes integer NOT NULL DEFAULT 0,
    failures integer NOT NULL DEFAULT 0,
    interrupted boolean NOT NULL DEFAULT false,
    retry_at double precision,
    reason text NOT NULL DEFAULT '',
    last_err text NOT NULL DEFAULT '',
    changed_at double precision NOT NULL DEFAULT 0,
    token bigint,
    runner text,
    holder bigint,
    lease_until timestamptz,
    PRIMARY KEY (queue, id)
);
CREATE INDEX live_pending ON statequeue.live (queue, id) WHERE state = 'pending';
CREATE INDEX live_state ON statequeue.live (queue, state) WHERE state <> 'pending';
CREATE UNIQUE INDEX live_token ON statequeue.live (token) WHERE token IS NOT NULL;
CREATE SEQUENCE statequeue.tokens;
CREATE SEQUENCE statequeue.sessions MINVALUE 1 MAXVALUE 2147483647 CYCLE;
-- One row per finished attempt; the primary key allows one result per token.
CREATE TABLE statequeue.results (
    token bigint PRIMARY KEY,
    queue text NOT NULL,
    id bigint NOT NULL,
    attempt integer NOT NULL,
    state text NOT NULL,
    ok boolean NOT NULL,
    exit_code integer,
    signal integer,
    duration double precision,
    reason text NOT NULL DEFAULT '',
    result jsonb,
    err text NOT NULL DEFAULT '',
    at double precision NOT NULL
);
CREATE INDEX results_item ON statequeue.results (queue, id, token);
CREATE INDEX results_at ON statequeue.results (queue, at);
CREATE TABLE statequeue.events (
    seq bigserial PRIMARY KEY,
    queue text NOT NULL,
    id bigint,
    body jsonb NOT NULL
);
CREATE INDEX events_queue ON statequeue.events (queue, seq);
CREATE INDEX events_item ON statequeue.events (queue, id, seq) WHERE id IS NOT NULL;
-- Counts per state: writers insert deltas (no hot row to fight over),
-- status rolls them up into ``counts``.
CREATE TABLE statequeue.count_deltas (
    queue text NOT NULL,
    state text NOT NULL,
    delta bigint NOT NULL
);
CREATE TABLE statequeue.counts (
    queue text NOT NULL,
    state text NOT NULL,
    n bigint NOT NULL,
    PRIMARY KEY (queue, state)
);
CREATE TABLE statequeue.runners (
    queue text NOT NULL,
    runner_id text NOT NULL,
    pid integer NOT NULL,
    host text NOT NULL,
    boot text NOT NULL,
    since double precision NOT NULL,
    command jsonb NOT NULL,
    session bigint NOT NULL,
    stopped_at double precision,
    PRIMARY KEY (queue, runner_id)
);
"""

_V2_LEASES = """
-- Liveness is the item's lease (live.lease_until, on the database clock), no
-- longer a session advisory lock: a runner that lost its connection but
-- lives and reconnects keeps its items while its leases hold.
-- last_reap_at lets one reaper at a time look for expired leases.
ALTER TABLE statequeue.queues ADD COLUMN last_reap_at timestamptz;
CREATE INDEX live_lease ON statequeue.live (queue, lease_until) WHERE state = 'running';
-- A runner is alive while its heartbeat keeps seen_at within its lease.
ALTER TABLE statequeue.runners ADD COLUMN seen_at timestamptz, ADD COLUMN lease double precision;
"""

_V3_ARCHIVE = """
-- Finished attempts' output (promise 11), stored by the runner that held the
-- claim: one row per attempt, fenced by the claim's token.
CREATE TABLE statequeue.logs (
    queue text NOT NULL,
    id bigint NOT NULL,
    attempt integer NOT NULL,
    token bigint NOT NULL,
    data bytea NOT NULL,
    at double precision NOT NULL,
    PRIMARY KEY (queue, id, attempt)
);
-- Compaction (promise 9) moves done and cancelled items' results and events
-- here, in batches; ``items.archived`` marks the items already moved (the item
-- rows and their sha256 key stay, so dedupe holds across the archive).
ALTER TABLE statequeue.items ADD COLUMN archived boolean NOT NULL DEFAULT false;
CREATE INDEX items_to_archive ON statequeue.items (queue, id)
    WHERE state IN ('done', 'cancelled') AND NOT archived;
CREATE TABLE statequeue.archived_results (
    token bigint PRIMARY KEY,
    queue text NOT NULL,
    id bigint NOT NULL,
    attempt integer NOT NULL,
    state text NOT NULL,
    ok boolean NOT NULL,
    exit_code integer,
    signal integer,
    duration double precision,
    reason text NOT NULL DEFAULT '',
    result jsonb,
    err text NOT NULL DEFAULT '',
    at double precision NOT NULL
);
CREATE INDEX archived_results_item ON statequeue.archived_results (queue, id, token);
CREATE TABLE statequeue.archived_events (
    seq bigint PRIMARY KEY,
    queue text NOT NULL,
    id bigint NOT NULL,
    body jsonb NOT NULL
);
CREATE INDEX archived_events_item ON statequeue.archived_events (queue, id, seq);
-- `drop` deletes a queue in batches: while it does, the queue cannot be opened.
ALTER TABLE statequeue.queues ADD COLUMN dropping boolean NOT NULL DEFAULT false;
-- The hot table churns (every claim and finish updates or deletes a row):
-- vacuum it after a fixed number of dead rows, not a fraction of its size.
ALTER TABLE statequeue.live SET (
    autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 100,
    autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 100
);
"""

_V4_NOTIFY = """
-- The transaction that wrote each event: the event feed's cursor reads by a
-- horizon of transactions (see postgres/events.py), so an event whose
-- transaction commits after a later seq's is never skipped.
ALTER TABLE statequeue.events ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX events_xid ON statequeue.events (queue, xid);
"""

_V5_FUNCTIONS = V5_FUNCTIONS
# One round trip per claim, finish, finish-and-claim and log (functions.py).

_V6_PINNED_PATH = V6_PINNED_PATH
# The functions' search_path pinned (functions.py).

# IF NOT EXISTS: a database whose version rows were rolled back (as a test of
# the v6 upgrade does) runs this again over the tables it made.
_V8_RATES = """
-- run --rate: one token bucket per queue (store/rate_bucket.py), taken from
-- by every runner of the queue on every host.
CREATE TABLE IF NOT EXISTS statequeue.rate_buckets (
    queue text PRIMARY KEY,
    lim double precision NOT NULL,
    burst double precision NOT NULL,
    rate_now double precision NOT NULL,
    tokens double precision NOT NULL,
    stamp double precision NOT NULL,
    peak double precision NOT NULL DEFAULT 0,
    cut_at double precision NOT NULL DEFAULT 0
);
-- Exit 75 (try later): how often each item asked, for --max-deferrals.
CREATE TABLE IF NOT EXISTS statequeue.deferrals (
    queue text NOT NULL,
    id bigint NOT NULL,
    count integer NOT NULL,
    PRIMARY KEY (queue, id)
);
"""

_V7_LEAN_WRITES = V7_LEAN_WRITES
# Fewer index inserts and count-delta rows per item (lean_writes.py).

_V9_WORKERS = """
-- The persistent workers a live runner last published (`run --persistent`):
-- figures `status` shows (pid, items done, RSS), not state.
ALTER TABLE statequeue.runners ADD COLUMN IF NOT EXISTS workers jsonb;
"""

# Version 7 built results_at (a BRIN) on an empty table, and a BRIN build
# ends with a summary of the range it stopped in, empty or not: so the first
# page range (128 pages, ~7,000 results) had a summary that every finish
# widened, its `at` being the newest: a WAL record (~70 B) per finish, and
# one index page that every runner's finish locked in turn (issue 21
# point 14). Without it the range is summarized once full (autosummarize),
# as every later one is, and reads scan an unsummarized range whole. Only
# while that range is not yet full: a full one keeps its summary.
_V10_RESULTS_RANGE = """
SELECT pg_catalog.brin_desummarize_range('statequeue.results_at', 0)
WHERE pg_catalog.pg_relation_size('statequeue.results')
    < 128 * pg_catalog.current_setting('block_size')::bigint;
"""

# A retried finish that overtook its first try (settle_retry.py).
_V11_SETTLE_RETRY = V11_SETTLE_RETRY

# The event feed reads the archive too (events.py): compaction moved a done
# item's events out of ``events`` before a follower had read them, and they
# were never shown (an outside tester's `events --follow` beside `compact`
# missed 42 and 130 of 600 end events). A moved event keeps the xid of the
# transaction that wrote it; rows archived before this version have none,
# and the feed does not look for them (they were archived before any
# follower of this version could be behind them).
_V14_ARCHIVED_FEED = """
ALTER TABLE statequeue.archived_events ADD COLUMN xid xid8;
CREATE INDEX archived_events_xid ON statequeue.archived_events (queue, xid)
    WHERE xid IS NOT NULL;
"""

# `status` says how many pending items wait for a retry's backoff or a
# deferral, and until when: read from this index, a range of the few that
# wait, not every pending row of the queue (it is measured). The runner's
# `next_due` reads it too.
_V15_RETRY_WAIT = """
CREATE INDEX IF NOT EXISTS live_retry_at ON statequeue.live (queue, retry_at)
    WHERE state = 'pending' AND retry_at IS NOT NULL;
"""

MIGRATIONS: tuple[str, ...] = (
    *(_V1, _V2_LEASES, _V3_ARCHIVE, _V4_NOTIFY, _V5_FUNCTIONS),
    *(_V6_PINNED_PATH, _V7_LEAN_WRITES, _V8_RATES, _V9_WORKERS, _V10_RESULTS_RANGE),
    *(_V11_SETTLE_RETRY, V12_CHECKS, V13_FUSED_STATEMENT, _V14_ARCHIVED_FEED),
    _V15_RETRY_WAIT,
)
"""Migration N+1 is ``MIGRATIONS[N]``; the schema version is how many ran."""


def schema_version(conn: Connection) -> int:
    """The version recorded in the database (0: never migrated)."""
    found = conn.execute("SELECT to_regclass('statequeue.schema_version') IS NOT NULL").fetchone()
    if not found or not found[0]:
        return 0
    row = conn.execute("SELECT max(version) FROM statequeue.schema_version").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def _checked_version(conn: Connection) -> int:
    """The recorded version, once the schema's owners are checked; SchemaTooNew
    when it is ahead of this code."""
    # Before anything in the schema is read: a view or function of
    # another role's would run as this one (owners.py).
    check_owners(conn)
    before = schema_version(conn)
    if before > len(MIGRATIONS):
        raise SchemaTooNew(
            f"the database's statequeue schema is version {before}, newer than this "
            f"statequeue knows (version {len(MIGRATIONS)}); upgrade statequeue"
        )
    return before


def migrate(conn: Connection, *, upto: int | None = None, build: bool = True) -> tuple[int, int]:
    """Bring the schema up to date (or to version ``upto``: tests build an
    older database so); returns (version before, version after).

    ``build=False``: a database with no statequeue schema yet is left as it
    is, (0, 0): a look (`status`, `queues`) writes nothing there.
    SchemaTooNew when the database is ahead of this code (nothing is changed)."""
    last = len(MIGRATIONS) if upto is None else upto
    with conn.transaction():
        # Up to date already (every open but the first): nothing to
        # serialise, so the lock is not taken. Sixteen runners opening a
        # queue at once queued on it for ~30 ms each (issue 21 point 14).
        before = _checked_version(conn)
        if before >= last or (before == 0 and not build):
            return before, before
    with conn.transaction():
        # Held to the end of the transaction: two processes opening an empty
        # database at once migrate it once. Read again under it: another
        # process may have migrated since the look above.
        # Any role may hold it (advisory locks are not privileged): the wait
        # is bounded, then exit 8 naming the holder, never a silent hang. Its
        # calls are qualified (connection.py pins the search_path too).
        lock_holders.take(conn, LOCK_CLASS, MIGRATION_LOCK, "migration lock")
        before = _checked_version(conn)
        if before == 0:
            conn.execute("CREATE SCHEMA IF NOT EXISTS statequeue")
            # Another role may have made the schema since the check (IF NOT
            # EXISTS then kept theirs): nothing is built in it if so.
            check_owners(conn)
            conn.execute(
                "CREATE TABLE IF NOT EXISTS statequeue.schema_version ("
                " version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            )
        for number in range(before + 1, last + 1):
            conn.execute(MIGRATIONS[number - 1].encode())
            conn.execute("INSERT INTO statequeue.schema_version (version) VALUES (%s)", (number,))
    return before, max(before, last)
