"""A second Ctrl-C while a work item is given back leaves no claim behind.

When a KeyboardInterrupt leaves ``with item:``, the item is given back: a
"pending" record, fsynced, then the claim let go. A second interrupt landing
between the two left this process holding the claim of an item the journal
called pending: every other `work()` loop and `statequeue run` waited for
it as long as the process lived (an outside tester's double Ctrl-C, and a
SIGINT storm, hung 2 runs in 3). The interrupt here is raised as the give
back's write returns, as the second Ctrl-C did.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from statequeue.api.queue import Queue
from statequeue.store.journal import store as journal_store

OTHER = textwrap.dedent(
    """
    from statequeue import Queue
    q = Queue("leak")
    for item in q.work():
        item.done(1)
        print(item.item, flush=True)
    """
)


def test_a_second_interrupt_during_a_give_back_leaves_the_item_takeable(
    sq_home: Path, sq_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    q = Queue("leak", home=sq_home)
    q.enqueue(["a", "b"])
    plain = journal_store.JournalStore._write
    armed = [False]

    def second_ctrl_c(self: Any, batch: list[Any], *, sync: bool) -> None:
        plain(self, batch, sync=sync)
        if armed[0] and any(r.get("t") == "intr" for r in batch):
            armed[0] = False
            raise KeyboardInterrupt  # as the give-back's record is durable

    monkeypatch.setattr(journal_store.JournalStore, "_write", second_ctrl_c)
    try:
        with pytest.raises(KeyboardInterrupt):
            for item in q.work():
                with item:
                    armed[0] = True
                    raise KeyboardInterrupt  # the first, in the body
        assert armed == [False]  # the second one was raised
        assert q.status().counts["pending"] == 2
        # This process lives on (a notebook, a daemon): another takes both.
        other = subprocess.run(
            [sys.executable, "-c", OTHER],
            env=sq_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert other.returncode == 0, other.stderr
        assert sorted(other.stdout.split()) == ["a", "b"]
    finally:
        q.close()
