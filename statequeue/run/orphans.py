"""A lost keeper in the older process shape (keeper.py): what is left of its items.

In that shape (the PostgreSQL store's, whose keeper fences leases) the keeper
is the parent of every item's process and holds their claims. If it dies
(kill -9, the OOM killer), its children would be reparented to init and run
on, holding their claim lock files, while the runner, hearing of the loss,
stopped and gave their items back: the next runner started a second copy
beside the first (promise 4).

So the console command's runner becomes a child subreaper before it starts
the keeper (``adopt_orphans``): the items' processes are then reparented to
it when the keeper dies, and on the loss it kills every child it has -- each
one's process group, then each process reparented to it as their parents
die -- until none is left (``end_orphans``); only then are the claims given
back. Where it could not (no subreaper: a library's runner, or a system
without ``prctl``; one that would not die in time), the items stay claimed
and recovery takes them once their claim lock files are free, as after a
kill -9 of the whole run.

A subreaper adopts more than the keeper's children: a process a --verify hook
(which the runner starts itself) leaves in the background is reparented to it
too, and stays a zombie once it ends unless reaped (``reap_adopted``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Collection

from statequeue.core import child_exits
from statequeue.run.keeper_os import children as _main_children

__all__ = ["adopt_orphans", "end_orphans", "is_subreaper", "reap_adopted"]

_PR_SET_CHILD_SUBREAPER = 36
END_WITHIN = 10.0
"""Seconds to wait for every adopted process to die (SIGKILL: an uninterruptible
sleep is the only delay) before leaving its items claimed to recovery."""
_POLL = 0.01

_subreaper = False


def adopt_orphans() -> bool:
    """Become a child subreaper (Linux >= 3.4), before the keeper starts: a
    descendant whose parent dies, the keeper included, is reparented to this
    process. Only the console command's own process does this (a library's
    caller would get orphans it knows nothing of). Whether it took."""
    global _subreaper
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        _subreaper = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    return _subreaper


def is_subreaper() -> bool:
    """Whether ``adopt_orphans`` took in this process."""
    return _subreaper


def _children() -> list[int]:
    """This process's children, zombies included, whichever thread is their parent."""
    me = os.getpid()
    if not os.path.exists(f"/proc/{me}/task/{me}/children"):
        return _main_children()  # no children lists in this kernel: a /proc scan
    found: list[int] = []
    for task in os.listdir(f"/proc/{me}/task"):
        with (
            contextlib.suppress(FileNotFoundError, ProcessLookupError),
            open(f"/proc/{me}/task/{task}/children", "rb") as f,
        ):
            found += [int(x) for x in f.read().split()]
    return found


def _reap_all() -> None:
    """Reap every child that has ended (the keeper's zombie among them)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def reap_adopted(own: Collection[int]) -> bool:
    """Reap, each by its pid, the children of this subreaper that have ended,
    but for those of ``own`` (the keeper: its waiter waits for it by pid) and
    those other code of this process started and waits for (child_exits):
    never ``waitpid(-1)``, which could take their exit status. A child of
    this process that none of them names is a process it adopted. Returns
    whether one of those still lives (False at once for no subreaper)."""
    if not _subreaper:
        return False
    alive = False
    for pid in _children():
        if pid in own or child_exits.expected(pid):
            continue
        with contextlib.suppress(ChildProcessError):
            ended, _ = os.waitpid(pid, os.WNOHANG)
            alive = alive or ended == 0
    return alive


def end_orphans(within: float = END_WITHIN) -> bool:
    """The keeper is gone: SIGKILL every child of this process (the items'
    processes it adopted, and each process adopted as their parents die) and
    reap it, until none is left. True once none is; False if this process
    is no subreaper (the items' processes went to init: nothing here can
    know of them) or some outlived ``within`` seconds."""
    if not _subreaper:
        return False
    end = time.monotonic() + within
    while True:
        left = _children()
        if not left:
            return True
        for pid in left:
            # Still unreaped (only this loop reaps here): the pid, and the
            # process group it leads (a new session's), are still its own.
            with contextlib.suppress(OSError):
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        _reap_all()
        if time.monotonic() >= end:
            return not _children()
        time.sleep(_POLL)
