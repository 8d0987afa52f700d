"""The guard reads a run's HOLD messages (the claims of items whose leftovers
may live) after it may already have adopted those leftovers: the runner is
reaped first, its orphans come to the guard, and an orphan nothing marks is
attributed to the items held at that moment. An item whose HOLD was read
later then had no process of its own, and its claim was let go while its
leftover still ran (seen as a flaky `test_leftover_wait_said`: only item 1
noted, with both leftovers). Each HOLD now adds its item to every adopted
orphan's items: held too long at worst, never too short (promise 4)."""

from __future__ import annotations

import os

from statequeue.run import keeper_protocol
from statequeue.run import keeper_state as ks


def test_an_item_held_after_its_orphan_was_adopted_is_the_orphans_too() -> None:
    state = ks.KeeperProcess(None, "q")
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    try:
        state.handle((keeper_protocol.HOLD, 0, 1), [r1])
        orphan = 424242  # adopted between the two HOLDs: attributed to item 1 alone
        state.owners = {orphan: frozenset({1})}
        state.handle((keeper_protocol.HOLD, 0, 2), [r2])
        assert state.owners[orphan] == frozenset({1, 2})
        assert state.held.keys() == {1, 2} and state.finished == {1, 2}
    finally:
        state.release({1, 2})
        for fd in (w1, w2):
            os.close(fd)
