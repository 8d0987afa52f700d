"""A wait for a retry's backoff is said (an outside tester's finding).

After `run --retries 1 --retry-delay 20s -- false`, `status` showed
`pending 1 ... runner: none active` with no due time, and the next `run`
printed nothing for 15 s before it ran the item (a backoff may reach 5 min).
`status` now says when pending items are not due yet (text and JSON's
`waiting` and `next_due`), on both stores, and a run waiting for one says so
once (not under --quiet).
"""

from __future__ import annotations

import json
import subprocess
import time

from tests.conftest import STATEQUEUE

DEADLINE = 60.0


def _sq(env: dict[str, str], store: str, *args: str) -> subprocess.CompletedProcess[str]:
    where = ["--store", store] if store else []
    return subprocess.run(
        [STATEQUEUE, *where, *args], env=env, capture_output=True, text=True, timeout=DEADLINE
    )


def _fail_once_with_backoff(env: dict[str, str], store: str) -> None:
    assert _sq(env, store, "enqueue", "f1").returncode == 0
    # --max-time: the run takes nothing after its first failure and ends,
    # leaving the item pending for its retry ~10-20 s away (jitter x0.5-1).
    run = _sq(env, store, "run", "--retries", "1", "--retry-delay", "20s", "--max-time", "0.2s",
              "--", "false")  # fmt: skip
    assert run.returncode == 0, run.stderr


def test_status_says_when_pending_items_wait_for_a_retry(
    sq_env: dict[str, str], store_url: str
) -> None:
    assert _sq(sq_env, store_url, "enqueue", "plain").returncode == 0
    quiet = _sq(sq_env, store_url, "status", "--json")
    assert json.loads(quiet.stdout)["next_due"] is None
    assert json.loads(quiet.stdout)["waiting"] == 0
    assert "waiting:" not in _sq(sq_env, store_url, "status").stdout
    assert _sq(sq_env, store_url, "cancel", "1").returncode == 0
    before = time.time()
    _fail_once_with_backoff(sq_env, store_url)
    text = _sq(sq_env, store_url, "status")
    assert text.returncode == 0, text.stderr
    line = next((x for x in text.stdout.splitlines() if x.startswith("waiting: ")), None)
    assert line is not None, text.stdout
    assert line.startswith("waiting: 1 pending item not due before "), line
    as_json = json.loads(_sq(sq_env, store_url, "status", "--json").stdout)
    assert as_json["waiting"] == 1
    assert before + 5 < as_json["next_due"] < time.time() + 21


def test_a_run_says_once_that_it_waits_for_a_retry(sq_env: dict[str, str]) -> None:
    _fail_once_with_backoff(sq_env, "")
    # The retry is 10-20 s away: a run stopped after 3 s has said why it waits.
    run = subprocess.run(
        ["timeout", "-s", "TERM", "3", STATEQUEUE, "run", "--", "false"],
        env=sq_env, capture_output=True, text=True, timeout=DEADLINE,
    )  # fmt: skip
    said = [x for x in run.stderr.splitlines() if "waiting for 1 item due in" in x]
    assert len(said) == 1, run.stderr
    assert "retry backoff" in said[0]
    quiet = subprocess.run(
        ["timeout", "-s", "TERM", "2", STATEQUEUE, "run", "--quiet", "--", "false"],
        env=sq_env, capture_output=True, text=True, timeout=DEADLINE,
    )  # fmt: skip
    assert "waiting for" not in quiet.stderr, quiet.stderr
