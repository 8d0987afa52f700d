"""``run --follow`` on a queue that does not exist yet creates it and waits.

A service (systemd, a container) is often started before the first item is
enqueued; it exited 7 ("no queue named ...") and the service manager kept
restarting it. With --follow the queue is now created, said on stderr, and
the runner waits for items; without --follow a missing queue is still exit 7.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from statequeue import Queue
from statequeue.core.exitcodes import ExitCode
from tests.conftest import STATEQUEUE
from tests.waiting import until


def test_follow_creates_the_queue_and_runs_what_comes(
    sq_env: dict[str, str], sq_home: Path, tmp_path: Path
) -> None:
    err_path = tmp_path / "err"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [STATEQUEUE, "-q", "svc", "run", "--follow", "--", "true"],
            env=sq_env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        until(lambda: "did not exist: created it" in err_path.read_text(), "the queue's creation")
        with Queue("svc", home=sq_home, create=False) as q:
            q.enqueue(["hello"])
            until(lambda: q.result("hello") is not None, "the item to run")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err_path.read_text()  # --follow: SIGTERM is a normal stop


def test_without_follow_a_missing_queue_is_still_not_found(sq_env: dict[str, str]) -> None:
    done = subprocess.run(
        [STATEQUEUE, "-q", "nosuch", "run", "--", "true"],
        env=sq_env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == ExitCode.NOT_FOUND, done.stderr
    assert done.stderr.startswith("statequeue: no queue"), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


def test_items_piped_to_run_get_a_hint_to_enqueue_them(sq_env: dict[str, str]) -> None:
    """`seq 3 | statequeue run -- echo` said only "no queue": run takes its
    items from the queue, never from its stdin."""
    for args, said in (
        ([], "; put items in it first: ... | statequeue enqueue\n"),
        (["-q", "jobs-2"], "; put items in it first: ... | statequeue -q jobs-2 enqueue\n"),
    ):
        done = subprocess.run(
            [STATEQUEUE, *args, "run", "--", "echo"],
            env=sq_env,
            input="1\n2\n3\n",
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == ExitCode.NOT_FOUND, done.stderr
        assert done.stderr.endswith(said) and done.stderr.count("\n") == 1, done.stderr
