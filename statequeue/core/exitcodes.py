"""Named exit codes, and what each means: the one source of truth.

`statequeue help exit-codes` generates its table from these names and meanings
(a test checks that it lists every code), so the page cannot drift from the code.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Every exit code the CLI uses, in one place; `.meaning` says what each means."""

    OK = 0
    FAILED = 1
    USAGE = 2
    NOTHING_TO_DO = 3
    RUNNER_ACTIVE = 4
    DAMAGED = 5
    IO_ERROR = 6
    NOT_FOUND = 7
    LOCKED = 8
    UNSAFE_FOLDER = 9
    RESOURCES = 10
    STORE_UNREACHABLE = 11
    SCHEMA_TOO_NEW = 12
    WORKER_BROKEN = 13
    INTERRUPTED_HUP = 129
    INTERRUPTED_INT = 130
    INTERRUPTED_TERM = 143

    @property
    def meaning(self) -> str:
        """What this exit code tells the caller, in one sentence (Markdown)."""
        return MEANINGS[self]


MEANINGS: dict[ExitCode, str] = {
    ExitCode.OK: (
        "success: every item this run took succeeded, or there was nothing to do; `run "
        "--max-time` ran out, even with items left pending (a paused queue, retries not due "
        "yet: its last line says so, and `--exit-empty` does not apply); "
        "`run --follow` stopped by SIGTERM with every child stopped within `--grace`"
    ),
    ExitCode.FAILED: (
        "at least one item failed (after its retries) or was held (poison after "
        "`--max-crashes`, `--on-interrupted hold`); or `run` stopped because its keeper "
        "process died (its unfinished items run again next time)"
    ),
    ExitCode.USAGE: (
        "usage error or bad input (an `enqueue --file` that cannot be read too), a command "
        "that is not found or cannot start (a `#!` line naming a missing interpreter, a "
        "script with none), a `--verify` or `--shell` script that "
        "cannot run, an unknown help topic, a folder given as the FILE of `export -o`, "
        "`report -o` or `import`, or a FILE of `export -o` or `report -o` in a folder that "
        "takes no new file (`/proc`, one you may not write); or a home or queue folder (or a "
        "file in it) you may not read or write: permission denied, a read-only file system; "
        "nothing was changed"
    ),
    ExitCode.NOTHING_TO_DO: (
        "`run --exit-empty 3` found nothing to do: no pending item was left (by default that "
        "exits 0, as `xargs -r` does)"
    ),
    ExitCode.RUNNER_ACTIVE: (
        "another runner is active on the queue: `run --single` does not start, `drop` "
        "refuses (stop the runner first)"
    ),
    ExitCode.DAMAGED: (
        "the queue's files are damaged (the message names file and line); run `fsck`. "
        "`queues` still lists the others, each damaged one on its own line"
    ),
    ExitCode.IO_ERROR: (
        "a write or fsync failed (disk full, I/O error); the queue stays recoverable"
    ),
    ExitCode.NOT_FOUND: (
        "no such queue or item, (`logs --attempt N`) no such attempt, or no such file or "
        "folder: `import FILE`, `export -o FILE` or `report -o FILE` into a missing folder; "
        "or the queue was dropped while the command had it open (`status --watch`, "
        "`events --follow`, `logs --follow`; on PostgreSQL, a `run` frozen past its lease "
        "meanwhile)"
    ),
    ExitCode.LOCKED: (
        "the queue stayed locked by another process for `STATEQUEUE_LOCK_TIMEOUT` seconds "
        "(default 60); or, on PostgreSQL, another session held the migration lock as long "
        "(the message names its pid, role and application)"
    ),
    ExitCode.UNSAFE_FOLDER: (
        "the home or queue folder (or a PostgreSQL queue's scratch folder) is not safe: "
        "another user owns it, group or others can write it, or it is a symbolic link "
        "(`statequeue help internals`); or a file in it is another user's, or is not a "
        "regular file (a FIFO); or the FILE of `export -o` or `report -o` is another "
        "user's file or FIFO in a shared sticky folder such as `/tmp`; or the PostgreSQL "
        "`statequeue` schema or something in it belongs to a role the user is not a member "
        "of, or has a trigger (`statequeue help postgres`)"
    ),
    ExitCode.RESOURCES: (
        "`run` ran short of file descriptors, processes or memory before it could start a "
        "single child (opening the queue, its own pipes, a spawn); the items it took were "
        "given back, pending; or any other command ran short of file descriptors, "
        "processes or memory (`ulimit -n`, an endless input under a memory limit): what "
        "was acknowledged is kept"
    ),
    ExitCode.STORE_UNREACHABLE: (
        "the PostgreSQL store (`--store`) could not be reached: connection refused, login "
        "failed, no such database, or the server went away (`run`: for longer than "
        "`--give-up-after`); or it denied a privilege (permission denied) or a write (a "
        "read-only standby or session); or a statement failed unexpectedly on the server "
        "(the message says what it said); the message masks any password"
    ),
    ExitCode.SCHEMA_TOO_NEW: (
        "the database's statequeue schema is newer than this statequeue; upgrade statequeue"
    ),
    ExitCode.WORKER_BROKEN: (
        "`run --persistent`: the worker exited before replying to its first request twice in "
        "a row; the items it was given count one crash each, nothing else was charged"
    ),
    ExitCode.INTERRUPTED_HUP: (
        "stopped by SIGHUP (its terminal or session closed); unfinished items run again next time"
    ),
    ExitCode.INTERRUPTED_INT: "stopped by SIGINT (Ctrl-C); unfinished items run again next time",
    ExitCode.INTERRUPTED_TERM: "stopped by SIGTERM; unfinished items run again next time",
}
"""What each exit code means, as `statequeue help exit-codes` shows it."""
