"""`retry` and `cancel` of several ids check every id before anything changes.

Both recover a named item a dead runner left before they apply. Found by
outside testing: `retry 1 999999` recovered item 1 (held, its crash
counted) and only then refused the unknown id, though a refused command
must change nothing (promise 6). Now every id is checked first, on both
stores: an unknown id, or an item in a state the action does not take,
refuses the whole command with its one line and exit code, and the dead
runner's items are still interrupted, as `status` showed them.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import STATEQUEUE
from tests.killed_run import run_killed_running_two

Env = dict[str, str]


def sq(env: Env, store_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    store = ["--store", store_url] if store_url else []
    return subprocess.run(
        [STATEQUEUE, *store, *args], env=env, capture_output=True, text=True, timeout=120
    )


def status(env: Env, store_url: str) -> dict[str, object]:
    found: dict[str, object] = json.loads(sq(env, store_url, "status", "--json").stdout)
    return found


@pytest.mark.parametrize(
    ("args", "code", "said"),
    [
        (("retry", "1", "999999"), 7, "no item 999999 in queue 'default'"),
        (("cancel", "1", "999999"), 7, "no item 999999 in queue 'default'"),
        (
            ("retry", "2", "1", "3"),
            2,
            "cannot retry item 3: it is pending (must be failed, held, cancelled)",
        ),
        (("cancel", "1", "4", "0"), 7, "no item 0 in queue 'default'"),
    ],
)
def test_a_refused_id_leaves_a_dead_runners_items_as_they_were(
    sq_env: Env,
    sq_home: Path,
    store_url: str,
    tmp_path: Path,
    args: tuple[str, ...],
    code: int,
    said: str,
) -> None:
    with run_killed_running_two(sq_env, sq_home, store_url, tmp_path, ["a", "b", "c", "d"]):
        before = status(sq_env, store_url)
        assert before["interrupted"] == [1, 2], before
        refused = sq(sq_env, store_url, *args)
        assert (refused.returncode, refused.stdout) == (code, ""), refused
        assert refused.stderr == f"statequeue: {said}; nothing was changed\n"
        after = status(sq_env, store_url)
        assert (after["interrupted"], after["held"]) == ([1, 2], []), after
        assert after["counts"] == before["counts"], after
        # With only good ids, the same command does it.
        good = [a for a in args if a not in ("999999", "3", "0")]
        done = sq(sq_env, store_url, *good, "--json")
        assert done.returncode == 0, done.stderr
        assert sorted(json.loads(done.stdout)["changed"]) == sorted(int(i) for i in good[1:])
