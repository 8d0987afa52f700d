"""`cancel` and `retry` of several ids are all-or-nothing; their refusal of one
id now says that the others were not changed either (one line, same exit code)."""

from __future__ import annotations

import subprocess

import pytest

from statequeue.api.queue import Queue
from statequeue.core.exitcodes import ExitCode
from statequeue.core.models import ItemState
from tests.conftest import STATEQUEUE

NOTHING = "; nothing was changed"


@pytest.mark.parametrize(
    ("argv", "code", "said"),
    [
        (["cancel", "3", "1"], ExitCode.USAGE, "cannot cancel item 1: it is done"),
        (["retry", "2", "1"], ExitCode.USAGE, "cannot retry item 1: it is done"),
        (["cancel", "3", "99"], ExitCode.NOT_FOUND, "no item 99 in queue"),
        (["retry", "2", "99"], ExitCode.NOT_FOUND, "no item 99 in queue"),
    ],
)
def test_a_refusal_of_several_ids_says_nothing_changed(
    sq_env: dict[str, str], store_url: str, argv: list[str], code: int, said: str
) -> None:
    with Queue("r", store=store_url or None) as queue:
        queue.enqueue(["done", "failed"])
        for item in queue.work():
            if item.item == "done":
                item.done()
            else:
                item.fail("no")
        queue.enqueue(["pending"])
        before = queue.states([1, 2, 3])
        assert before == {1: ItemState.DONE, 2: ItemState.FAILED, 3: ItemState.PENDING}
    store = ["--store", store_url] if store_url else []
    run = [STATEQUEUE, *store, "-q", "r"]
    out = subprocess.run([*run, *argv], env=sq_env, capture_output=True, text=True, timeout=60)
    assert out.returncode == code, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and said in lines[0] and lines[0].endswith(NOTHING), lines
    with Queue("r", store=store_url or None) as queue:
        assert queue.states([1, 2, 3]) == before
    # One id alone: the line is as before.
    alone = subprocess.run(
        [*run, argv[0], argv[-1]], env=sq_env, capture_output=True, text=True, timeout=60
    )
    assert alone.returncode == code and NOTHING not in alone.stderr, alone.stderr


def test_a_refusal_reads_the_same_on_both_stores(sq_env: dict[str, str], store_url: str) -> None:
    """`cancel` of a cancelled item said "(must be pending, failed, held)" on
    the local store and nothing of it on PostgreSQL, where a cancelled or
    done item has no hot row; a done one said it on neither. Found by an
    outside tester running one scenario on both stores."""
    with Queue("r", store=store_url or None) as queue:
        queue.enqueue(["done", "cancelled"])
        for item in queue.work():
            item.done()
            break
        assert queue.cancel([2]) == [2]
    store = ["--store", store_url] if store_url else []
    run = [STATEQUEUE, *store, "-q", "r"]
    said = {}
    for verb, item_id in (("cancel", "2"), ("cancel", "1"), ("retry", "1")):
        out = subprocess.run(
            [*run, verb, item_id], env=sq_env, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == ExitCode.USAGE, out.stderr
        said[verb, item_id] = out.stderr.strip()
    assert said == {
        ("cancel", "2"): "statequeue: cannot cancel item 2: it is cancelled "
        "(must be pending, failed, held)",
        ("cancel", "1"): "statequeue: cannot cancel item 1: it is done "
        "(must be pending, failed, held)",
        ("retry", "1"): "statequeue: cannot retry item 1: it is done "
        "(must be failed, held, cancelled)",
    }
