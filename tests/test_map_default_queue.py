"""Where ``map``/``@resumable`` keep results without ``queue=``, and nested calls.

Found by an outside tester: without ``queue=`` every map and resumable
function used ``$STATEQUEUE_QUEUE`` (else ``default``). A worker that ``run``
started has that variable set to the run's queue, so its private ``map``
put sub-steps into the run's queue, which then ran the worker on them,
recursively; and two functions returned each other's results (keyed by the
item's text alone). A call inside ``fn`` for the same item of the same queue
waited for its own claim forever. Now the default queue is named for the
function, a function without a stable name needs ``queue=``, and the nested
call raises UsageError.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

import statequeue
from statequeue import Queue
from statequeue.core.errors import UsageError
from statequeue.maintenance import list_queues


@statequeue.resumable()
def square(x: str) -> int:
    return int(x) ** 2


@statequeue.resumable()
def negate(x: str) -> int:
    return -int(x)


def shout(x: str) -> str:
    return x.upper()


def test_two_functions_keep_their_own_results(sq_home: Path) -> None:
    assert square("3") == 9
    assert negate("3") == -3  # was 9: square's stored result
    assert statequeue.map(len, ["333"]) == [3]
    names = {q.queue.rsplit("-", 1)[0] for q in list_queues(home=sq_home)}
    assert f"{__name__}.square" in names and f"{__name__}.negate" in names, names


def test_the_run_s_queue_variable_is_not_the_default(
    sq_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Queue("jobs", home=sq_home) as jobs:
        jobs.enqueue(["a"])
    # As in a worker that `statequeue -q jobs run` started.
    monkeypatch.setenv("STATEQUEUE_QUEUE", "jobs")
    assert statequeue.map(shout, ["a-part0", "a-part1"]) == ["A-PART0", "A-PART1"]
    with Queue("jobs", home=sq_home, create=False) as jobs:
        assert [v.item for v in jobs.store.items()] == ["a"]  # the run's queue is untouched
    (own_name,) = [q.queue for q in list_queues(home=sq_home) if q.queue != "jobs"]
    assert own_name.startswith(f"{__name__}.shout-"), own_name
    with Queue(own_name, home=sq_home, create=False) as own:
        assert sorted(v.item for v in own.store.items()) == ["a-part0", "a-part1"]


def test_a_function_without_a_stable_name_needs_a_queue(sq_home: Path) -> None:
    with pytest.raises(UsageError, match="give queue=NAME"):
        statequeue.map(lambda s: s, ["a"])

    def nested(s: str) -> str:
        return s

    with pytest.raises(UsageError, match="give queue=NAME"):
        statequeue.resumable()(nested)
    assert list_queues(home=sq_home) == []  # nothing was created
    assert statequeue.map(lambda s: s, ["a"], queue="given") == ["a"]


# Run apart, with a time limit: before the fix this waited forever.
_NESTED = """
import asyncio, sys
import statequeue
from statequeue.maintenance import list_queues
from statequeue.core.errors import UsageError

@statequeue.resumable(queue="p")
def download(u):
    return u + "!"

@statequeue.resumable(queue="p")
def parse(u):
    return download(u) * 2

@statequeue.resumable(queue="other")
def elsewhere(u):
    return download(u) + "?"

@statequeue.resumable(queue="r")
def again(u):
    return again(u)

async def inner(u):
    return u

async def outer(u):
    return (await statequeue.map_async(inner, [u], queue="a"))[0]

async def main():
    try:
        await statequeue.map_async(outer, ["z"], queue="a")
    except statequeue.MapFailed as exc:
        print("async:", type(exc.errors["z"]).__name__)

for call in (parse, again):
    try:
        call("x")
    except UsageError as exc:
        print(call.__name__ + ":", "would wait for itself" in str(exc))
print("elsewhere:", elsewhere("y"))
asyncio.run(main())
"""


def test_a_call_inside_fn_for_the_same_item_is_refused(
    sq_env: dict[str, str], tmp_path: Path
) -> None:
    script = tmp_path / "nested.py"
    script.write_text(_NESTED)
    done = subprocess.run(
        [sys.executable, str(script)],
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "parse: True",
        "again: True",
        "elsewhere: y!?",  # another queue, or another item: no refusal
        "async: UsageError",
    ], done.stderr


def test_another_thread_asking_for_the_item_still_waits(sq_home: Path) -> None:
    calls: list[str] = []

    @statequeue.resumable(queue="threads")
    def slow(x: str) -> str:
        calls.append(x)
        return x * 2

    async def both() -> list[str]:
        return list(await asyncio.gather(*(asyncio.to_thread(slow, "k") for _ in range(4))))

    assert asyncio.run(both()) == ["kk"] * 4
    assert calls == ["k"]  # ran once; the other threads waited, none was refused


_SAME_NAME = """
import sys
import statequeue

def f(x):
    return sys.argv[1] + x

print(statequeue.map(f, ["1"])[0])
"""


def test_same_named_scripts_and_bound_methods_do_not_share_results(
    sq_env: dict[str, str], tmp_path: Path
) -> None:
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
        (tmp_path / side / "job.py").write_text(_SAME_NAME)
    said = [
        subprocess.run(
            [sys.executable, str(tmp_path / side / "job.py"), side.upper()],
            env=sq_env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for side in ("a", "b")
    ]
    assert said == ["A1", "B1"]  # b/job.py's f got a/job.py's result before


class _Fetcher:
    def __init__(self, base: str) -> None:
        self.base = base

    def get(self, path: str) -> str:
        return self.base + path


def test_a_bound_method_needs_a_queue(sq_home: Path) -> None:
    with pytest.raises(UsageError, match="bound to an object"):
        statequeue.map(_Fetcher("http://one/").get, ["p"])
