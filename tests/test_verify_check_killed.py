"""A runner killed (-9) while an item's ``--verify`` check runs: no crash of
the item, on either store.

A run claims an item before it asks the check whether the work is done; the
command starts only if it is not. The claim used to be the attempt: a runner
killed during the check counted a crash, and after ``--max-crashes`` (3) such
kills the item was held as poison though its command had never run. A check
is not an attempt of the command: the item now goes back uncounted (no
attempt, no crash), still to be checked by the next run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import pytest

from statequeue import Queue
from tests.conftest import STATEQUEUE
from tests.dead_runner import die_holding_two
from tests.waiting import gone, until


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _kill_during_check(
    sq_env: dict[str, str], sq_home: Path, store_url: str, argv: list[str], checks: Path
) -> None:
    """Start ``argv``, wait for its check to start, then SIGKILL the runner
    (and the check, which a runner without a guard leaves behind)."""
    before = len(_lines(checks))
    proc = subprocess.Popen(argv, env=sq_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        until(lambda: len(_lines(checks)) > before, "the check to start")
        with Queue(home=sq_home, store=store_url or None, create=False) as q:
            (runner,) = q.status().runners
        os.kill(runner.pid, signal.SIGKILL)
        check = int(_lines(checks)[-1])
        until(lambda: gone(runner.pid), "the runner's end")
        # The guard (journal shape) kills it too: it may end between the two.
        with contextlib.suppress(ProcessLookupError):
            os.kill(check, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()


def _run_argv(store_url: str, check: str, *more: str) -> list[str]:
    store = ["--store", store_url] if store_url else []
    return [STATEQUEUE, *store, "run", "--verify", check, *more, "--", "true"]


def test_kills_during_a_verify_first_check_count_no_crash(
    sq_env: dict[str, str], sq_home: Path, tmp_path: Path, store_url: str
) -> None:
    checks = tmp_path / "checks"
    check = f"echo $$ >> {checks}; exec sleep 60"
    with Queue(home=sq_home, store=store_url or None) as q:
        q.enqueue(["a"])
    argv = _run_argv(store_url, check, "--verify-first")
    for _ in range(3):  # --max-crashes, the default
        _kill_during_check(sq_env, sq_home, store_url, argv, checks)
    with Queue(home=sq_home, store=store_url or None, create=False) as q:
        report = q.store.recover()  # the last killed run's, as the next claim does
        assert (report.retried, report.held) == ([1], []), report
        (view,) = q.store.items()
        assert (view.state.value, view.attempts) == ("pending", 0), view
        assert "during the --verify check" in view.reason, view
    # The next run still checks it first (its first attempt), then runs it.
    done = subprocess.run(
        _run_argv(store_url, f"echo $$ >> {checks}; exit 1", "--verify-first"),
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert len(_lines(checks)) == 4
    with Queue(home=sq_home, store=store_url or None, create=False) as q:
        (view,) = q.store.items()
    assert (view.state.value, view.attempts) == ("done", 1), view


@pytest.mark.parametrize("policy", ["retry", "fail"])
def test_kills_during_the_check_after_a_crash_keep_it_to_be_checked(
    sq_env: dict[str, str], sq_home: Path, tmp_path: Path, store_url: str, policy: str
) -> None:
    """Items 1 and 2 were in flight when their runner died (one crash each);
    three kills during their checks count none more, and they stay marked
    interrupted: the next run checks them again, and one the check says is
    done is recorded done without running."""
    with Queue(home=sq_home, store=store_url or None) as q:
        q.enqueue(["1", "2"])
    die_holding_two(sq_env, sq_home, store_url)
    checks = tmp_path / "checks"
    argv = _run_argv(store_url, f"echo $$ >> {checks}; exec sleep 60", "--on-interrupted", policy)
    for _ in range(3):
        _kill_during_check(sq_env, sq_home, store_url, argv, checks)
    with Queue(home=sq_home, store=store_url or None, create=False) as q:
        report = q.store.recover()  # the last killed run's, as the next claim does
        assert report.held == [], report  # not held as poison
        states = {v.item: v.state.value for v in q.store.items()}
    assert states == {"1": "pending", "2": "pending"}, states
    ran = tmp_path / "ran"
    done = subprocess.run(
        [
            *_run_argv(store_url, "test {} = 1", "--on-interrupted", policy)[:-2],
            *("--", "sh", "-c", f'echo "$1" >> {ran}', "_", "{}"),
        ],
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    with Queue(home=sq_home, store=store_url or None, create=False) as q:
        states = {v.item: v.state.value for v in q.store.items()}
    if policy == "retry":  # 1 done by the check, 2 not: it runs
        assert states == {"1": "done", "2": "done"}, (states, done.stderr)
        assert _lines(ran) == ["2"]
    else:  # 2 not done, after an interruption: failed without running
        assert states == {"1": "done", "2": "failed"}, (states, done.stderr)
        assert not ran.exists()


_DIE_CHECKING = """
import os, sys
from statequeue import Queue
from statequeue.core.identity import new_runner
q = Queue(home=sys.argv[1], store=sys.argv[2] or None)
runner = new_runner()
q.register_runner(runner)
first = q.claim(runner)
q.store.check_starts(first)
second = q.claim(runner)
q.store.check_starts(second)
q.store.check_ends(second)  # its command started
q.compact()  # the mark lives through a compaction (the journal's item records)
os._exit(0)
"""


def test_the_store_tells_a_check_from_a_command_after_a_death(
    sq_env: dict[str, str], sq_home: Path, store_url: str
) -> None:
    """Store level: item 1's runner died during its check (no crash, no
    attempt), item 2's after its check, while its command ran (a crash)."""
    import sys

    with Queue(home=sq_home, store=store_url or None) as q:
        q.enqueue(["1", "2"])
    died = subprocess.run(
        [sys.executable, "-c", _DIE_CHECKING, str(sq_home), store_url], env=sq_env, check=False
    )
    assert died.returncode == 0
    with Queue(home=sq_home, store=store_url or None, create=False) as q:
        report = q.store.recover(max_crashes=1)  # one crash holds: only item 2 crashed
        assert (report.retried, report.held) == ([1], [2]), report
        views = {v.item: (v.state.value, v.attempts) for v in q.store.items()}
    assert views == {"1": ("pending", 0), "2": ("held", 1)}, views
