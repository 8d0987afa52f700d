"""Named exit codes. The README's table is generated from the same names."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Every exit code the CLI uses, in one place."""

    OK = 0
    """Success: every item this run took succeeded."""
    FAILED = 1
    """At least one item failed (after its attempts)."""
    USAGE = 2
    """Bad invocation or bad input; nothing was changed."""
    NOTHING_TO_DO = 3
    """`run --exit-empty 3` found no pending item (by default, nothing to do exits 0)."""
    RUNNER_ACTIVE = 4
    """`run --single` and another runner is active on the queue."""
    DAMAGED = 5
    """The queue's files are damaged; run `statequeue fsck`."""
    IO_ERROR = 6
    """A write or fsync failed (disk full, I/O error); the queue is left recoverable."""
    NOT_FOUND = 7
    """The named queue, item or attempt does not exist."""
    LOCKED = 8
    """The queue stayed locked by another process for longer than the lock timeout."""
    UNSAFE_FOLDER = 9
    """The home or queue folder (or a PostgreSQL queue's scratch folder) is owned by another
    user, writable by group or others, or a link; or the PostgreSQL statequeue schema, or
    something in it, belongs to a role the user is not a member of, or has a trigger."""
    RESOURCES = 10
    """`run` ran short of open files, processes or memory before it could start
    a single child (opening the queue, its own pipes, a spawn); the items it
    took were given back, pending."""
    STORE_UNREACHABLE = 11
    """The PostgreSQL store could not be reached: a refused connection, a failed
    login, a missing database, the server went away (for `run`: for longer than
    --give-up-after), or it denied a privilege (permission denied); nothing more was changed."""
    SCHEMA_TOO_NEW = 12
    """The database's statequeue schema is newer than this statequeue; upgrade it."""
    INTERRUPTED_INT = 130
    """Stopped by SIGINT (Ctrl-C); unfinished items run again next time."""
    INTERRUPTED_TERM = 143
    """Stopped by SIGTERM; unfinished items run again next time."""
