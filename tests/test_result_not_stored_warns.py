"""A result file `run` could not store as written warns, naming the item and why.

Only a result JSON the store cannot hold used to warn; a result file over
1 MiB, one that is not JSON and one that could not be read were stored as an
error value while the run printed `[ok]` and said nothing.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from statequeue.api.queue import Queue
from tests.conftest import STATEQUEUE

Env = dict[str, str]
SCRIPT = """
case "$1" in
  bigjson) python3 -c 'print("[" + "1," * 600000 + "1]")' > "$STATEQUEUE_RESULT" ;;
  textonly) echo hello > "$STATEQUEUE_RESULT" ;;
  fifo) rm -f "$STATEQUEUE_RESULT"; mkfifo "$STATEQUEUE_RESULT" ;;
  *) echo '{"ok": 1}' > "$STATEQUEUE_RESULT" ;;
esac
"""


def test_every_result_not_stored_as_written_warns(sq_env: Env, sq_home: Path) -> None:
    items = ["bigjson", "textonly", "fifo", "fine"]
    subprocess.run([STATEQUEUE, "enqueue", *items], env=sq_env, check=True, capture_output=True)
    done = subprocess.run(
        [STATEQUEUE, "run", "--", "sh", "-c", SCRIPT, "sh", "{}"],
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    warned = [line for line in done.stderr.splitlines() if "recorded an error instead" in line]
    assert warned == [
        "statequeue: item 1: result file larger than 1048576 bytes; recorded an error instead",
        "statequeue: item 2: result file is not valid JSON; recorded an error instead",
        "statequeue: item 3: result file not read: not a regular file; recorded an error instead",
    ], done.stderr
    with Queue(home=sq_home) as q:  # the values stored are as before
        stored = {r.item: r.result for r in q.results()}
    assert stored == {
        "bigjson": {"error": "result file larger than 1048576 bytes; not stored"},
        "textonly": {"error": "result file is not valid JSON", "text": "hello\n"},
        "fifo": {"error": "result file not read: not a regular file"},
        "fine": {"ok": 1},
    }
