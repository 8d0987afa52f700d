"""`retry` undoes a cancel: a cancelled item named by id, or every one with
`retry --cancelled`, is pending again and the next run takes it.

A cancelled item could never run again: `retry` refused it ("must be
failed, held") and `enqueue` skipped it as already queued, so a mistaken
`cancel` could only be undone by an export and an edit (pueue's `restart`
takes any finished task). On both stores, before and after a `compact`
(PostgreSQL moves a cancelled item's rows to its archive tables). A retry
of every item (`retry --failed`, the library's `q.retry()`) still leaves
cancelled items alone: only `--cancelled` or an id takes them.
"""

from __future__ import annotations

import json
import subprocess

from statequeue.api.queue import Queue
from statequeue.core.models import ItemState
from tests.conftest import STATEQUEUE


def _sq(env: dict[str, str], url: str, *args: str) -> subprocess.CompletedProcess[str]:
    store = ["--store", url] if url else []
    return subprocess.run(
        [STATEQUEUE, *store, "-q", "u", *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_retry_undoes_a_cancel_on_both_stores(sq_env: dict[str, str], store_url: str) -> None:
    with Queue("u", store=store_url or None) as q:
        q.enqueue(["a", "b", "c", "d"])
        assert q.cancel([2, 3, 4]) == [2, 3, 4]
        q.compact()
        assert q.retry() == []  # failed and held only: cancelled items stay
    by_id = _sq(sq_env, store_url, "retry", "2", "--json")
    assert by_id.returncode == 0, by_id.stderr
    assert json.loads(by_id.stdout)["changed"] == [2]
    every = _sq(sq_env, store_url, "retry", "--cancelled", "--json")
    assert every.returncode == 0, every.stderr
    assert json.loads(every.stdout)["changed"] == [3, 4]
    ran = _sq(sq_env, store_url, "run", "--quiet", "--", "true")
    assert ran.returncode == 0, ran.stderr
    with Queue("u", store=store_url or None, create=False) as q:
        assert q.states([1, 2, 3, 4]) == dict.fromkeys([1, 2, 3, 4], ItemState.DONE)
        assert q.status().counts["cancelled"] == 0 and q.status().counts["done"] == 4
        assert not q.fsck().damaged
    again = _sq(sq_env, store_url, "retry", "2")
    assert again.returncode == 2 and "it is done (must be failed, held, cancelled)" in again.stderr
