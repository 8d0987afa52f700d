"""`report` as an outside review of its page found it (one test per finding):
what the page says must be true of what it shows, every cut list says what
it left out, and no text is cut without a mark."""

from __future__ import annotations

import re
import subprocess
import time

from statequeue.api.queue import Queue
from tests.conftest import STATEQUEUE


def _page(env: dict[str, str], *args: str) -> str:
    return subprocess.run(
        [STATEQUEUE, "report", "-o", "-", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout


def _header_row(page: str, name: str) -> str:
    found = re.search(f"<dt>{name}</dt><dd>(.*?)</dd>", page)
    assert found is not None, name
    return found.group(1)


def test_a_window_with_no_attempt_has_no_success_rate(sq_env: dict[str, str]) -> None:
    """`report --since` over a stretch in which nothing ran said "100.0% of
    finished items" (the queue's counts now, not the window's): now "-". A
    window's rate is of the items its attempts finished."""
    with Queue() as q:
        q.enqueue(["a", "b", "c"])
        for item in q.work():
            with item:
                if item.item == "c":
                    item.fail("boom")
        assert q.report().success_rate == 2 / 3
        assert q.report(60).success_rate == 2 / 3  # all of it in the last minute
        empty = q.report(60, now=time.time() + 3600)
        assert empty.success_rate is None and empty.figures.attempts == 0
    assert _header_row(_page(sq_env), "success rate") == "66.7% of finished items"
    time.sleep(1.1)
    rate = _header_row(_page(sq_env, "--since", "1s"), "success rate")
    assert rate.startswith("- of items finished in the last 1s"), rate
