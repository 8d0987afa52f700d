"""``--on-interrupted fail|hold`` waits for ``--verify`` before it settles an item.

Promise 3: after a crash only the in-flight items are recovered, by the
policy, after ``--verify``. Under ``fail`` and ``hold`` recovery settled the
interrupted items at once, without running the check: work that had finished
was marked failed (or held), the run's summary said ``failed: 0`` and exited
0, and ``--quiet`` printed nothing. Now the items wait pending for the check:
one it says is done is recorded done; only the others are failed or held,
counted in the summary, with a warning that ``--quiet`` keeps.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from statequeue import Queue
from tests.conftest import STATEQUEUE
from tests.dead_runner import die_holding_two
from tests.waiting import until


@pytest.mark.parametrize("policy", ["fail", "hold"])
def test_the_check_comes_before_the_policy(
    sq_env: dict[str, str], sq_home: Path, tmp_path: Path, policy: str, store_url: str
) -> None:
    store = ["--store", store_url] if store_url else []
    with Queue(home=sq_home, store=store_url or None) as q:
        q.enqueue(["1", "2", "3"])
    die_holding_two(sq_env, sq_home, store_url)
    marks = tmp_path / "marks"
    marks.mkdir()
    (marks / "1").touch()  # item 1's work had finished; item 2's had not
    check = f"touch {marks}/checked-{{}}; test -e {marks}/{{}}"
    ran = subprocess.run(
        [
            *(STATEQUEUE, *store, "run", "--quiet", "--json", "--on-interrupted", policy),
            *("--verify", check, "--", "sh", "-c", f'touch "{marks}/ran-$1"', "_", "{}"),
        ],
        env=sq_env,
        capture_output=True,
        text=True,
        check=False,
    )
    summary = json.loads(ran.stdout)
    # The check ran for both interrupted items, and neither ran again.
    assert (marks / "checked-1").exists() and (marks / "checked-2").exists(), ran.stderr
    assert not (marks / "ran-1").exists() and not (marks / "ran-2").exists()
    assert (marks / "ran-3").exists()
    with Queue(home=sq_home, store=store_url or None, create=False) as q:
        views = {v.item: v for v in q.store.items()}
    states = {text: v.state.value for text, v in views.items()}
    reason = views["2"].reason
    expected = "failed" if policy == "fail" else "held"
    assert states == {"1": "done", "2": expected, "3": "done"}, (states, ran.stderr)
    assert "--verify says it is not done" in reason, reason
    assert summary["verified"] == 1
    # Said even under --quiet, and counted: a cron job hears of it.
    assert f"#2: {'marked failed' if policy == 'fail' else 'held'}" in ran.stderr
    # A held item is counted held, and exits 1 as a failure does: exit 0 says
    # every item the run took succeeded (`statequeue help exit-codes`).
    failed, held = (1, 0) if policy == "fail" else (0, 1)
    assert (summary["failed"], summary["held"]) == (failed, held), (summary, ran.stderr)
    assert ran.returncode == 1, ran.stderr


def test_a_check_stopped_by_a_signal_settles_nothing(
    sq_env: dict[str, str], sq_home: Path, tmp_path: Path
) -> None:
    """SIGTERM while the check runs kills it: it said nothing, so the items
    stay to be checked by the next run (they were marked failed unchecked)."""
    with Queue(home=sq_home) as q:
        q.enqueue(["1", "2", "3"])
    die_holding_two(sq_env, sq_home, "")
    marks = tmp_path / "marks"
    marks.mkdir()
    (marks / "1").touch()
    check = f"touch {marks}/checked-{{}}; sleep 30; test -e {marks}/{{}}"
    argv = [STATEQUEUE, "run", "--on-interrupted", "fail", "--verify", check, "--", "true"]
    proc = subprocess.Popen(argv, env=sq_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        until(lambda: any(marks.glob("checked-*")), "the check to start")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err
    with Queue(home=sq_home, create=False) as q:
        states = {v.item: v.state.value for v in q.store.items()}
        assert "failed" not in states.values(), (states, err)
        assert set(q.status().interrupted) | {
            v.item_id for v in q.store.items() if v.state.value == "pending"
        } >= {1, 2}
    # The next run checks them: 1 is done, 2 is not (failed by the policy).
    check_again = f"test -e {marks}/{{}}"
    again = subprocess.run(
        [STATEQUEUE, "run", "--on-interrupted", "fail", "--verify", check_again, "--", "true"],
        env=sq_env,
        capture_output=True,
        text=True,
        check=False,
    )
    with Queue(home=sq_home, create=False) as q:
        states = {v.item: v.state.value for v in q.store.items()}
    assert states == {"1": "done", "2": "failed", "3": "done"}, (states, again.stderr)


def test_a_check_that_times_out_does_not_run_the_item_under_fail(
    sq_env: dict[str, str], sq_home: Path, tmp_path: Path
) -> None:
    """The check's time limit (--timeout) passed: nothing says the work is
    undone, but under --on-interrupted fail it must not run again (it ran)."""
    with Queue(home=sq_home) as q:
        q.enqueue(["1", "2", "3"])
    die_holding_two(sq_env, sq_home, "")
    ran = subprocess.run(
        [
            *(STATEQUEUE, "run", "--timeout", "1", "--on-interrupted", "fail"),
            *("--verify", "sleep 30", "--", "sh", "-c", f'touch "{tmp_path}/ran-$1"', "_", "{}"),
        ],
        env=sq_env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert not (tmp_path / "ran-1").exists() and not (tmp_path / "ran-2").exists(), ran.stderr
    assert (tmp_path / "ran-3").exists(), ran.stderr
    with Queue(home=sq_home, create=False) as q:
        states = {v.item: v.state.value for v in q.store.items()}
    assert states == {"1": "failed", "2": "failed", "3": "done"}, (states, ran.stderr)
