"""Refusing a ``statequeue`` schema that another role could have rigged.

In a database where several roles may create schemas, whoever creates
``statequeue`` first owns it and everything in it: the owner can read and
change every queue, add items that others' runners execute, and hang
triggers or swap functions so that code of theirs runs with the rights of
whoever uses the queue. So before anything in the schema is read, the schema
and every object in it (relations, functions, types, operators) must belong
to the connecting role or to a role it is a member of (``pg_has_role ...
'MEMBER'``: a role it may SET ROLE to, whose rights it can take anyway).
This is the local store's owner check of its folders, for the database.

Triggers are refused outright: statequeue creates none, and PostgreSQL lets
a role with only the TRIGGER privilege on a table add one (pg_trigger does
not even record who did). A trigger function runs with the rights of the
role whose write fired it, so a trigger planted by another role would run
as the user; one the owner added is as likely a mistake as not, and
``DROP TRIGGER`` is the fix either way. Rules and row-level security
policies need the table's ownership, which the owner check already covers.

All of it is one catalog query (a few hundred rows at most), made once per
connection that opens the store, before the schema's version is read, and
again under the migration lock when a migration is due.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from statequeue.core.errors import UnsafeSchema

if TYPE_CHECKING:
    from statequeue.store.postgres.connection import Connection

SCHEMA = "statequeue"

# Every name is qualified with pg_catalog: this query must not resolve
# anything through a search_path that another role could write to.
_FOREIGN = """
WITH s AS MATERIALIZED (
    SELECT n.oid, n.nspowner FROM pg_catalog.pg_namespace n WHERE n.nspname = %(schema)s
), found(rank, kind, name, owner) AS MATERIALIZED (
    SELECT 0, 'schema', %(schema)s::text, s.nspowner FROM s
    UNION ALL
    SELECT 1, CASE c.relkind WHEN 'r' THEN 'table' WHEN 'i' THEN 'index'
        WHEN 'S' THEN 'sequence' WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view'
        WHEN 'p' THEN 'table' WHEN 'I' THEN 'index' WHEN 'f' THEN 'foreign table'
        ELSE 'relation' END, c.relname::text, c.relowner
    FROM pg_catalog.pg_class c JOIN s ON c.relnamespace = s.oid
    UNION ALL
    SELECT 2, 'function', p.proname::text, p.proowner
    FROM pg_catalog.pg_proc p JOIN s ON p.pronamespace = s.oid
    UNION ALL
    SELECT 3, 'type', t.typname::text, t.typowner
    FROM pg_catalog.pg_type t JOIN s ON t.typnamespace = s.oid
    UNION ALL
    SELECT 4, 'operator', o.oprname::text, o.oprowner
    FROM pg_catalog.pg_operator o JOIN s ON o.oprnamespace = s.oid
    UNION ALL
    SELECT 5, 'trigger', g.tgname::text || ' on ' || c.relname::text, p.proowner
    FROM pg_catalog.pg_trigger g
    JOIN pg_catalog.pg_class c ON c.oid = g.tgrelid
    JOIN s ON c.relnamespace = s.oid
    JOIN pg_catalog.pg_proc p ON p.oid = g.tgfoid
    WHERE NOT g.tgisinternal
)
-- Materialized first: pg_has_role is asked about the schema's few objects,
-- not (pushed down by the planner) about every row of pg_proc.
SELECT f.rank, f.kind, f.name, pg_catalog.pg_get_userbyid(f.owner), CURRENT_USER::text
FROM found f WHERE f.rank = 5 OR NOT pg_catalog.pg_has_role(f.owner, 'MEMBER')
ORDER BY 1, 3 LIMIT 1
"""

HOW_TO_SHARE = 'see "Sharing a database between roles" in `statequeue help postgres`'


def check_owners(conn: Connection) -> None:
    """UnsafeSchema, naming the object and its owner, unless the schema (if
    it exists) and everything in it belong to a role this one is a member
    of, and no table of it has a trigger."""
    row = conn.execute(_FOREIGN, {"schema": SCHEMA}).fetchone()
    if row is None:
        return
    _, kind, name, owner, me = row
    if kind == "trigger":
        trigger, _, table = str(name).partition(" on ")
        raise UnsafeSchema(
            f"trigger {trigger} on {SCHEMA}.{table} (its function owned by role {owner}) was "
            "not made by statequeue, and a trigger runs as whoever writes the row; refusing "
            f"to use the store (fix: DROP TRIGGER {trigger} ON {SCHEMA}.{table})"
        )
    shown = SCHEMA if kind == "schema" else f"{SCHEMA}.{name}"
    raise UnsafeSchema(
        f"PostgreSQL {kind} {shown} is owned by role {owner}, not by you (role {me}) or a role "
        f"you are a member of; refusing to use it, since its owner could read and change your "
        f"queues and run code as you (fix: use a database or role of your own; {HOW_TO_SHARE})"
    )
