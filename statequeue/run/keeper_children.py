"""The keeper's look at its children in /proc: which they are (one held
file, read again from the top at each look), and which item each is of (its
environment).

Standard library only: under ``python -I -S`` it is imported from its own folder.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # not typing's: the keeper starts under -I -S (see keeper_os.suppress)
if TYPE_CHECKING or __package__:
    from statequeue.run.keeper_os import children
else:  # a script under -I -S: keeper_process.py put our folders on sys.path
    from keeper_os import children

NO_CHILDREN_FILE = -2  # open_children: there is no such file (CONFIG_PROC_CHILDREN is off)
CHILDREN_READ = 65536  # bytes per read of it (about 9000 pids)


def open_children() -> int:
    """Our /proc children file, opened for ``read_children``; NO_CHILDREN_FILE
    where the kernel has none."""
    me = os.getpid()
    path = f"/proc/{me}/task/{me}/children"
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return NO_CHILDREN_FILE  # CONFIG_PROC_CHILDREN is off


def read_children(fd: int) -> list[int]:
    """Our children (zombies included): one pread of ``fd`` (``open_children``'s),
    where ``keeper_os.children`` opens the file each time (nine system calls
    and a file object, where a persistent worker's item makes one look per item)."""
    if fd == NO_CHILDREN_FILE:
        return children()
    text = b""
    while True:  # a read past the start re-reads the list from the top (seq_file)
        chunk = os.pread(fd, CHILDREN_READ, len(text))
        text += chunk
        if len(chunk) < CHILDREN_READ:
            return [int(pid) for pid in text.split()]


def item_of(pid: int, queue: str) -> int:
    """The STATEQUEUE_ID in ``pid``'s environment, or -1 (also when its
    STATEQUEUE_QUEUE is not ``queue``)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return -1
    found = dict(v.split(b"=", 1) for v in env if b"=" in v)
    if found.get(b"STATEQUEUE_QUEUE", b"").decode(errors="replace") != queue:
        return -1
    try:
        return int(found.get(b"STATEQUEUE_ID", b"-1"))
    except ValueError:
        return -1
