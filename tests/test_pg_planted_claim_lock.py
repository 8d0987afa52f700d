"""A file planted at a claim lock's name in a PostgreSQL queue's scratch
folder, and kept locked by whoever planted it (outside testing): recovery
opened it without the checks of ``fileio.open_own``, found its lock held and
took the item for still running, forever. A file that is not our own (here:
another user's) is no holder of our claim: the dead runner's item is
recovered at once on this host (the same-host shortcut, reaping.py), and the
planted file goes. Both names recovery asks about: the claim's token file
and, for a claim without one, its runner's file. On a real server
(tests/pg.py); chown needs root.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from statequeue.core.identity import new_runner

pytest.importorskip("psycopg")
from statequeue.store.postgres import PostgresStore  # after the skip: needs psycopg

NOBODY = 65534

_CLAIM_AND_DIE = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from statequeue.core.identity import new_runner
    from statequeue.store.postgres import PostgresStore

    store = PostgresStore(sys.argv[1], "q", scratch=Path(sys.argv[2]), lease=600.0)
    runner = new_runner()
    store.register_runner(runner)
    claim = store.claim(runner)
    assert claim is not None
    print(claim.item_id, claim.token, runner.runner_id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)

_LOCK_AND_WAIT = textwrap.dedent(
    """
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("locked", flush=True)
    sys.stdin.read()
    """
)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to plant another user's file")
@pytest.mark.parametrize("planted", ["token", "runner"])
def test_a_locked_foreign_claim_file_does_not_hold_a_dead_runners_item(
    pg_url: str, tmp_path: Path, planted: str
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    reaper = PostgresStore(pg_url, "q", scratch=scratch)
    holder: subprocess.Popen[str] | None = None
    try:
        reaper.enqueue(["a"])
        died = subprocess.run(
            [sys.executable, "-c", _CLAIM_AND_DIE, pg_url, str(scratch)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert died.returncode == -signal.SIGKILL, died.stderr
        item, token, runner_id = died.stdout.split()
        claims = scratch / "claims"
        # Only the planted file is left: without a token file, its runner's decides.
        (claims / f"{token}.lock").unlink()
        (claims / f"runner-{runner_id}.lock").unlink()
        name = f"{token}.lock" if planted == "token" else f"runner-{runner_id}.lock"
        foreign = claims / name
        foreign.write_bytes(b"")
        os.chown(foreign, NOBODY, NOBODY)
        holder = subprocess.Popen(
            [sys.executable, "-c", _LOCK_AND_WAIT, str(foreign)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        again = reaper.claim(new_runner())  # its lease has ~600 s to go: the shortcut only
        assert again is not None, "the planted, locked file kept the item from recovery"
        assert (again.item_id, again.attempt, again.interrupted) == (int(item), 2, True)
        assert not foreign.exists() or foreign.stat().st_uid != NOBODY
    finally:
        if holder is not None:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(timeout=30)
        reaper.close()
