"""The PostgreSQL store: one queue shared by runners on many hosts.

The only package that imports psycopg (the ``postgres`` extra), and only
when a store URL is opened.
"""

from __future__ import annotations

from statequeue.store.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
