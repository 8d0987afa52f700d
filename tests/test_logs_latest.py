"""`statequeue logs ID` shows the latest attempt, as its --help says and as
`logs --all` does: when that attempt wrote nothing, it says so rather than
printing an older attempt's output as if it were the latest (the README's
quick start met it: `logs 7` printed attempt 1's "fails, on purpose" for an
item that attempt 2 had since done)."""

from __future__ import annotations

import subprocess

from tests.conftest import STATEQUEUE

# The first attempt writes a line and fails; the second succeeds silently.
FAIL_LOUDLY_FIRST = '[ "$STATEQUEUE_ATTEMPT" -gt 1 ] || { echo "attempt 1 failed" >&2; exit 1; }'


def _sq(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([STATEQUEUE, *args], env=env, capture_output=True, text=True, timeout=120)


def test_logs_shows_the_latest_attempt_even_when_it_wrote_nothing(
    sq_env: dict[str, str],
) -> None:
    assert _sq(sq_env, "enqueue", "a").returncode == 0
    run = _sq(
        sq_env, "run", "--retries", "1", "--retry-delay", "0", "--", "sh", "-c", FAIL_LOUDLY_FIRST
    )
    assert run.returncode == 0, run.stderr
    latest = _sq(sq_env, "logs", "1")
    assert latest.returncode == 0 and latest.stdout == "", latest.stdout
    assert latest.stderr == (
        "statequeue: no output was recorded for attempt 2 of item 1"
        " (attempt 1 has output: `statequeue -q default logs 1 --attempt 1`)\n"
    )
    first = _sq(sq_env, "logs", "1", "--attempt", "1")
    assert first.returncode == 0 and first.stdout == "attempt 1 failed\n", first
    every = _sq(sq_env, "logs", "--all")
    assert every.returncode == 0 and every.stdout == "", every.stdout


def test_logs_of_an_archived_item_say_compaction_removed_them(sq_env: dict[str, str]) -> None:
    # A new user's `logs 7` after `compact --keep-logs 0` said "no output was
    # recorded" for an attempt whose output they had read a minute before.
    assert _sq(sq_env, "enqueue", "a").returncode == 0
    assert _sq(sq_env, "run", "--", "sh", "-c", "echo said $0").returncode == 0
    assert _sq(sq_env, "logs", "1").stdout == "said a\n"
    assert _sq(sq_env, "compact", "--keep-logs", "0").returncode == 0
    gone = _sq(sq_env, "logs", "1")
    assert gone.returncode == 0 and gone.stdout == ""
    assert gone.stderr == (
        "statequeue: no output is kept for attempt 1 of item 1: it wrote none, or its log"
        " was removed when compaction archived it (--keep-logs)\n"
    )
    # One that never wrote a word, archived with its log kept (7 days): the
    # message blamed compaction alone (an outside tester's first look).
    assert _sq(sq_env, "enqueue", "b").returncode == 0
    assert _sq(sq_env, "run", "--", "true").returncode == 0
    assert _sq(sq_env, "compact").returncode == 0
    silent = _sq(sq_env, "logs", "2").stderr
    assert "it wrote none, or its log was removed" in silent, silent
