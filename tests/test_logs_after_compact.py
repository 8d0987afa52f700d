"""`logs ID` after `compact` of an item whose latest attempt wrote nothing.

Found by an outside tester: attempt 1 failed loudly, attempt 2 succeeded
silently; `logs 1` said (truly) "no output was recorded for attempt 2";
after `compact` it said "no output is kept for attempt 2 of item 1: it was
archived, and compaction removes archived items' logs (--keep-logs)",
though attempt 2 had never written output and attempt 1's log was still
kept. Compaction removes logs oldest first: while attempt 1's log is kept,
attempt 2's was never removed. Now it says so, and names the attempt that
has output.
"""

from __future__ import annotations

import subprocess

from tests.conftest import STATEQUEUE

FAIL_LOUDLY_FIRST = '[ "$STATEQUEUE_ATTEMPT" = 1 ] && { echo boom >&2; exit 1; }; exit 0'


def _sq(env: dict[str, str], store: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    argv = [STATEQUEUE, *store, "-q", "lg", *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def test_logs_after_compact_say_the_attempt_recorded_none(
    sq_env: dict[str, str], store_url: str
) -> None:
    store = ["--store", store_url] if store_url else []
    assert _sq(sq_env, store, "enqueue", "7").returncode == 0
    retried = ["run", "--retries", "1", "--retry-delay", "0.1s", "--", "sh", "-c"]
    assert _sq(sq_env, store, *retried, FAIL_LOUDLY_FIRST).returncode == 0
    said = (
        "statequeue: no output was recorded for attempt 2 of item 1"
        " (attempt 1 has output: `statequeue -q lg logs 1 --attempt 1`)\n"
    )
    before = _sq(sq_env, store, "logs", "1")
    assert before.stderr == said and before.stdout == ""
    assert _sq(sq_env, store, "compact").returncode == 0
    after = _sq(sq_env, store, "logs", "1")
    assert after.returncode == 0 and after.stdout == ""
    assert after.stderr == said  # not "it was archived, and compaction removes ..."
    kept = _sq(sq_env, store, "logs", "1", "--attempt", "1")
    assert kept.returncode == 0 and kept.stdout == "boom\n", kept.stderr
    if store_url:  # a PostgreSQL item's history has no archive record to tell removal by
        return
    # Once compaction did remove every log (--keep-logs 0), it says that.
    assert _sq(sq_env, store, "compact", "--keep-logs", "0").returncode == 0
    gone = _sq(sq_env, store, "logs", "1")
    assert gone.stderr.startswith(
        "statequeue: no output is kept for attempt 2 of item 1:"
        " it wrote none, or its log was removed"
    )
    assert "--attempt" not in gone.stderr
