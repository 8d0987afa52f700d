"""`report` and `queues` after a kill -9 of a run AND its keeper, while the
items' own processes live on and hold their claims: they say what `status`
says ("still run by processes of a dead runner", `held_by_dead_runner`).

Found by an outside tester: `status` listed the two items apart, but the
HTML report showed no attempt in flight at all (it looked only at the items
`status` lists as interrupted), and on PostgreSQL `queues --json` listed
them as interrupted ("the next run recovers them"), which the next run does
not do while their claim locks are held on this host: `queues` read each
queue without looking at this host's claim locks.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from statequeue import Queue
from tests.conftest import STATEQUEUE
from tests.killed_run import run_killed_running_two, stop_item_processes
from tests.waiting import until

HELD = "; and 2 in flight when their runner died, not recovered yet (2 still run by processes"


def _cli(sq_env: dict[str, str], store_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    store = ["--store", store_url] if store_url else []
    return subprocess.run(
        [STATEQUEUE, *store, *args], env=sq_env, capture_output=True, text=True, timeout=120
    )


def _queues(sq_env: dict[str, str], store_url: str) -> dict[str, object]:
    done = _cli(sq_env, store_url, "queues", "--json")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    (queue,) = json.loads(done.stdout)["queues"]
    return dict(queue)


def _page(sq_env: dict[str, str], store_url: str, out: Path) -> str:
    made = _cli(sq_env, store_url, "report", "-o", str(out))
    assert made.returncode == 0, made.stderr
    return out.read_text()


def test_report_and_queues_agree_with_status_on_a_dead_runners_processes(
    sq_env: dict[str, str], sq_home: Path, store_url: str, tmp_path: Path
) -> None:
    with run_killed_running_two(
        sq_env, sq_home, store_url, tmp_path, ["a", "b", "c"], keeper_too=True
    ):
        with Queue(home=sq_home, store=store_url or None, create=False) as q:
            assert q.status().held_by_dead_runner == (1, 2)
            f = q.report().figures
        assert sorted((r.item_id, r.state, r.text) for r in f.in_flight) == [
            (1, "orphaned", "a"),
            (2, "orphaned", "b"),
        ]
        assert (f.in_flight_total, f.in_flight_held) == (2, 2)
        page = _page(sq_env, store_url, tmp_path / "held.html")
        assert HELD in page, page
        assert "Of these, 2 (state now: orphaned) are still run by processes of a dead" in page
        listed = _queues(sq_env, store_url)
        assert (listed["held_by_dead_runner"], listed["interrupted"]) == ([1, 2], [])
        text = _cli(sq_env, store_url, "queues").stdout
        assert text == "default\t3 items\tpending 1  running 2 (2 orphaned)\n", text
        stop_item_processes(tmp_path)  # they end: the items are interrupted now
        with Queue(home=sq_home, store=store_url or None, create=False) as q:
            until(lambda: q.status().interrupted == (1, 2), "1 and 2 interrupted")
            f = q.report().figures
        assert (f.in_flight_total, f.in_flight_held) == (2, 0)
        assert {r.state for r in f.in_flight} == {"running"}
        page = _page(sq_env, store_url, tmp_path / "interrupted.html")
        assert "; and 2 in flight when their runner died, not recovered yet<" in page
        assert "orphaned" not in page
        listed = _queues(sq_env, store_url)
        assert (listed["held_by_dead_runner"], listed["interrupted"]) == ([], [1, 2])


def test_queues_on_postgres_skips_a_queue_whose_scratch_folder_is_unsafe(
    sq_env: dict[str, str], sq_home: Path, pg_url: str
) -> None:
    """`queues` now reads each queue's scratch folder on this host (its claim
    locks): one that is unsafe is warned about and its queue left out, as
    `status` of that queue refuses it; a queue with no scratch folder here
    gets none made."""
    with Queue("open", home=sq_home, store=pg_url) as q:
        q.enqueue(["a"])
    with Queue("loose", home=sq_home, store=pg_url) as q:
        q.enqueue(["b"])
    loose = sq_home / ".postgres" / "loose"
    loose.chmod(0o777)  # writable by others: another user could plant its claim files
    (sq_home / ".postgres" / "open").rename(sq_home / ".postgres" / "moved")
    done = _cli(sq_env, pg_url, "queues")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "open\t1 item\tpending 1\n", done.stdout
    (line,) = done.stderr.splitlines()
    assert line.startswith("statequeue: warning: skipped: ") and str(loose) in line, line
    assert not (sq_home / ".postgres" / "open").exists()  # nothing made for a look
    refused = _cli(sq_env, pg_url, "-q", "loose", "status")
    assert refused.returncode == 9, refused.stderr
