"""Issue 23, the keeper's side of persistent workers (unit level, on a real
KeeperProcess object): ASSIGN makes a worker the process of each item in turn,
holding that item's claim fds while it lives, and lets go of the item it
leaves as of any finished item; a lease deadline is the current item's."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from statequeue.run import keeper_process as kp
from statequeue.run.keeper_process import KeeperProcess, Leader


@pytest.fixture
def keeper() -> Iterator[KeeperProcess]:
    mine, theirs = socket.socketpair()
    try:
        yield KeeperProcess(mine, "q")
    finally:
        mine.close()
        theirs.close()


def _fds() -> list[int]:
    r, w = os.pipe()
    os.close(w)
    return [r]


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_assign_holds_the_new_items_claim_and_releases_the_old_one(
    keeper: KeeperProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = Leader(token=4, item=kp.NO_ITEM, pid=50)
    keeper.leaders, keeper.by_token = {50: worker}, {4: worker}
    first, second = _fds(), _fds()
    keeper.handle((kp.ASSIGN, 4, 1), first)
    assert (worker.item, keeper.held, keeper.finished) == (1, {1: first}, set())
    keeper.handle((kp.DEADLINE, 4, 123.0), [])
    assert keeper.deadline_items == {4: 1}
    keeper.handle((kp.ASSIGN, 4, 2), second)
    assert worker.item == 2 and keeper.held[2] == second
    assert keeper.finished == {1}  # released once nothing of it is left
    assert keeper.deadlines == {} and keeper.deadline_items == {}  # item 1's lease, not 2's
    monkeypatch.setattr(keeper, "has_children", lambda: True)
    monkeypatch.setattr(keeper, "children_timed", lambda now: [50])
    keeper.settle(now=0.0)
    assert set(keeper.held) == {2} and not _open(first[0]) and _open(second[0])
    keeper.handle((kp.ASSIGN, 4, kp.NO_ITEM), [])  # answered: no item of its own now
    keeper.idle_until = keeper.cost_until = 0.0
    keeper.settle(now=0.0)
    assert keeper.held == {} and not _open(second[0])


def test_assign_to_a_worker_already_gone_keeps_nothing(keeper: KeeperProcess) -> None:
    fds = _fds()
    keeper.handle((kp.ASSIGN, 9, 1), fds)
    assert keeper.held == {} and not _open(fds[0])
