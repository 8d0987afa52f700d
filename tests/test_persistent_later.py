"""Issue 24 with `run --persistent`: a worker's ``{"id": N, "later": SECONDS}`` reply
defers its item as a per-item command's exit 75 does, and ``--rate`` paces requests.

The worker speaks the line protocol by hand (it stands for a worker in any language)
and is run by the real CLI in a subprocess; times come from the start and defer events.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from statequeue import Queue
from statequeue.run.protocol import BadReply, parse_reply
from tests.conftest import STATEQUEUE

Env = dict[str, str]

# Each item's prefix says what to reply: "later1.5-" asks for 1.5 s on attempt 1,
# "later-" asks with null (the backoff) on attempt 1, "hour-" asks for an hour,
# "always-" asks for 0 s every time,
# "bad:<json>-" replies {"id", "later": <json>} (a malformed reply), anything else is
# done. Every item appends the worker's pid to MARKS/<item>.pid.
WORKER = r"""
import json, os, sys

MARKS = sys.argv[1]
reply = os.fdopen(int(os.environ["STATEQUEUE_REPLY_FD"]), "w")
for line in sys.stdin:
    req = json.loads(line)
    item, first = req["item"], req["attempt"] == 1
    with open(os.path.join(MARKS, item + ".pid"), "a") as f:
        f.write(f"{os.getpid()}\n")
    answer = {"id": req["id"], "ok": True, "result": {"pid": os.getpid()}}
    if item.startswith("later1.5-") and first:
        answer = {"id": req["id"], "later": 1.5, "reason": "HTTP 429"}
    elif item.startswith("later-") and first:
        answer = {"id": req["id"], "later": None}
    elif item.startswith("hour-"):
        answer = {"id": req["id"], "later": 3600}
    elif item.startswith("always-"):
        answer = {"id": req["id"], "later": 0}
    elif item.startswith("bad:"):
        answer = {"id": req["id"], **json.loads(item[4:item.rindex("-")])}
    reply.write(json.dumps(answer) + "\n")
    reply.flush()
"""


def sq(env: Env, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STATEQUEUE, *args], env=env, input=stdin, capture_output=True, text=True, timeout=120
    )


def run_persistent(env: Env, tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    worker, marks = tmp_path / "worker.py", tmp_path / "marks"
    worker.write_text(WORKER)
    marks.mkdir(exist_ok=True)
    command = [sys.executable, str(worker), str(marks)]
    return sq(env, "run", "--persistent", *options, "--", *command)


def events(env: Env) -> list[dict[str, Any]]:
    done = sq(env, "events", "--json")
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def enqueue(env: Env, items: list[str]) -> None:
    done = sq(env, "enqueue", stdin="".join(f"{item}\n" for item in items))
    assert done.returncode == 0, done.stderr


def pids(tmp_path: Path, item: str) -> list[int]:
    return [int(line) for line in (tmp_path / "marks" / f"{item}.pid").read_text().split()]


# -- the protocol's check ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("later", "seconds"), [(12, 12.0), (0, 0.0), (0.25, 0.25), (None, None), (True, None)]
)
def test_a_later_reply_parses_to_seconds_or_the_backoff(later: Any, seconds: Any) -> None:
    reply = parse_reply(json.dumps({"id": 7, "later": later}).encode(), 7)
    assert (reply.ok, reply.later, reply.retry_after) == (False, True, seconds)


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"later": -1}, '"later" is not a number of seconds >= 0'),
        ({"later": "soon"}, '"later" is not seconds (a number >= 0), null or true'),
        ({"later": False}, '"later" is not seconds (a number >= 0), null or true'),
        ({"later": [1]}, '"later" is not seconds (a number >= 0), null or true'),
        ({"later": 1, "ok": True}, 'a "later" reply has no "ok": true and no "result"'),
        ({"later": 1, "result": 3}, 'a "later" reply has no "ok": true and no "result"'),
        ({"later": 1, "reason": 3}, '"reason" is not a string'),
    ],
)
def test_a_malformed_later_reply_is_a_bad_reply(fields: dict[str, Any], why: str) -> None:
    with pytest.raises(BadReply, match=why.replace("(", r"\(").replace(")", r"\)")):
        parse_reply(json.dumps({"id": 7, **fields}).encode(), 7)


# -- a `later` reply under the real run -------------------------------------------------------


def _later_runs_again_after_its_delay(env: Env, tmp_path: Path) -> None:
    enqueue(env, ["later1.5-a"])
    done = run_persistent(env, tmp_path, "--retries", "0")
    assert done.returncode == 0, done.stderr
    assert "[later] #1 later1.5-a attempt 1: try again in 1.5s" in done.stderr
    records = [r for r in events(env) if r.get("id") == 1]
    assert [r["t"] for r in records] == ["enq", "start", "defer", "start", "end"]
    defer, again = records[2], records[3]
    assert (defer["delay"], defer["exit"], defer["deferrals"]) == (1.5, 75, 1)
    assert again["at"] >= defer["at"] + 1.5 - 0.002  # the records' times are in ms
    assert records[4]["state"] == "done"
    figures = json.loads(sq(env, "stats", "--json").stdout)
    assert figures["deferred"] == 1
    assert figures["failures"]["attempts"] == 0  # a deferral is no failure
    first, second = pids(tmp_path, "later1.5-a")
    assert first == second  # the worker stays for the item's next attempt


def test_a_later_reply_runs_the_item_again_after_that_delay_without_a_retry(
    sq_env: Env, tmp_path: Path
) -> None:
    _later_runs_again_after_its_delay(sq_env, tmp_path)


def test_a_later_reply_defers_on_postgresql(sq_env: Env, tmp_path: Path, pg_url: str) -> None:
    _later_runs_again_after_its_delay(dict(sq_env, STATEQUEUE_STORE=pg_url), tmp_path)


def test_a_later_reply_of_null_waits_the_adaptive_backoff(sq_env: Env, tmp_path: Path) -> None:
    enqueue(sq_env, ["later-a"])
    done = run_persistent(sq_env, tmp_path, "--retries", "0", "--retry-delay", "0.4")
    assert done.returncode == 0, done.stderr
    kinds = [r for r in events(sq_env) if r.get("id") == 1]
    assert [r["t"] for r in kinds] == ["enq", "start", "defer", "start", "end"]
    assert 0.2 <= kinds[2]["delay"] <= 0.4  # the first backoff: --retry-delay, with jitter


def test_later_replies_count_toward_max_deferrals(sq_env: Env, tmp_path: Path) -> None:
    enqueue(sq_env, ["always-a"])
    done = run_persistent(sq_env, tmp_path, "--max-deferrals", "2")
    assert done.returncode == 1, done.stderr
    assert "deferred 3 times, more than --max-deferrals 2" in done.stderr
    kinds = [r["t"] for r in events(sq_env) if r.get("id") == 1]
    assert kinds == ["enq", "start", "defer", "start", "defer", "start", "end"]
    status = json.loads(sq(sq_env, "status", "--json").stdout)
    assert status["counts"]["failed"] == 1


def test_later_replies_halve_the_queues_rate(sq_env: Env, tmp_path: Path) -> None:
    """Each deferral feeds the AIMD as exit 75 does: the rate `status` shows is halved."""
    enqueue(sq_env, ["hour-a", "hour-b"])
    # Both items ask to wait an hour: the run stops taking items after 1 s.
    done = run_persistent(sq_env, tmp_path, "--rate", "50/s", "--max-time", "1s")
    assert done.returncode == 0, done.stderr
    status = json.loads(sq(sq_env, "status", "--json").stdout)
    assert status["deferred"] == 2
    assert status["rate_limit"]["limit_per_second"] == 50.0
    current = status["rate_limit"]["current_per_second"]
    assert current in (25.0, 12.5)  # halved by each deferral, unless within the hold


@pytest.mark.parametrize(
    ("later", "why"),
    [
        ("-1", '"later" is not a number of seconds >= 0'),
        ('"soon"', '"later" is not seconds (a number >= 0), null or true'),
    ],
)
def test_a_bad_later_value_stops_the_worker_and_fails_the_attempt(
    sq_env: Env, tmp_path: Path, later: str, why: str
) -> None:
    bad = f'bad:{{"later": {later}}}-a'
    enqueue(sq_env, [bad, "ok-b"])
    done = run_persistent(sq_env, tmp_path, "-j1", "--retries", "0")
    assert done.returncode == 1, done.stderr
    with Queue(home=Path(sq_env["STATEQUEUE_HOME"])) as q:
        found = {v.item: (v.state.value, v.reason) for v in q.items()}
    state, reason = found[bad]
    assert state == "failed"
    assert reason.startswith("bad reply from the persistent worker: reply's " + why), reason
    assert found["ok-b"][0] == "done"
    assert pids(tmp_path, bad) != pids(tmp_path, "ok-b")  # a new worker took the next item
    assert not [r for r in events(sq_env) if r["t"] == "defer"]


# -- --rate paces requests, not worker starts ------------------------------------------------


@pytest.mark.slow
def test_rate_with_persistent_limits_requests_within_ten_percent(
    sq_env: Env, tmp_path: Path
) -> None:
    items = [f"ok-{i}" for i in range(101)]  # 100 intervals at 20/s: 5 s
    enqueue(sq_env, items)
    done = run_persistent(sq_env, tmp_path, "-j4", "--rate", "20/s", "--quiet")
    assert done.returncode == 0, done.stderr
    times = sorted(r["at"] for r in events(sq_env) if r["t"] == "start")
    assert len(times) == 101
    rate = (len(times) - 1) / (times[-1] - times[0])
    assert 18.0 <= rate <= 22.0, rate
    workers = {pid for item in items for pid in pids(tmp_path, item)}
    assert len(workers) <= 4, workers  # four workers, started once: the rate paced requests
