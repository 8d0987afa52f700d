"""What the keeper (keeper_process.py) asks of the system: where claim fds go
in a child, a program's path and its spawn, its own children, subreaper
status, CPU use.

Standard library only: the keeper imports this module from its own folder
when it runs as a script under ``python -I -S``.
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import sys

TYPE_CHECKING = False  # not typing's: the keeper starts under -I -S, and typing costs ~3 ms
if TYPE_CHECKING:
    from typing import Any


class suppress:
    """``contextlib.suppress`` without contextlib, which (with what it
    imports) costs the keeper ~3 ms of its start under ``-I -S``."""

    def __init__(self, *exceptions: type[BaseException]) -> None:
        self._exceptions = exceptions

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, value: object, tb: object) -> bool:
        return kind is not None and issubclass(kind, self._exceptions)


CLAIM_FD = 1000  # claim fds go here in the child (below, if RLIMIT_NOFILE is lower)
MAX_PROGRAMS = 64  # program names resolved on PATH and kept (a name from an item may vary)
RESET_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ)


def claim_target(index: int) -> int:
    """The fd number a child gets its ``index``-th claim fd at: high, so the
    ``exec 9>lockfile`` idiom in a worker never replaces it."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = CLAIM_FD + 1
    return min(CLAIM_FD, soft - 1) - index


def find_program(name: str, path: str | None = None) -> str:
    """Where posix_spawnp would find ``name`` on ``path`` (default: our
    PATH; an empty entry is the current folder, as for the shell); "" if
    nowhere (then posix_spawnp itself runs, and reports the error)."""
    if path is None:
        path = os.environ.get("PATH", os.defpath)
    for folder in path.split(os.pathsep):
        path = os.path.join(folder or ".", name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return ""


def spawn_found(
    programs: dict[str, str], argv: list[str], env: dict[str, str], actions: list[tuple[Any, ...]]
) -> int:
    """posix_spawn ``argv`` in a new session. A bare program name is looked
    up on PATH once per run (kept in ``programs``), not per item (posix_spawnp
    tries each PATH entry before it in the child, every time); if the file
    found is gone, look again."""
    name = argv[0]
    path = programs.get(name)
    if path is None and "/" not in name and len(programs) < MAX_PROGRAMS:
        path = programs[name] = find_program(name)
    if not path:
        return os.posix_spawnp(
            name, argv, env, file_actions=actions, setsid=True, setsigdef=RESET_SIGNALS
        )
    try:
        return os.posix_spawn(
            path, argv, env, file_actions=actions, setsid=True, setsigdef=RESET_SIGNALS
        )
    except OSError:
        del programs[name]  # replaced or removed meanwhile: PATH decides again
        return os.posix_spawnp(
            name, argv, env, file_actions=actions, setsid=True, setsigdef=RESET_SIGNALS
        )


# Run in the child between the keeper's spawn and the worker's exec: ask for
# SIGKILL when the keeper (the parent) dies, then check it has not died already.
# The signal survives exec, so the worker dies with the keeper even when the
# runner died too (a kill -9 of the job's process group): no one else would
# stop it, and a persistent worker holds no claim fd of its own. If the exec
# fails (a bad #! line, a file the kernel cannot run), its errno goes to the
# keeper on the pipe at EXEC_FD (closed by a successful exec), no traceback
# to the worker's stderr: the keeper reports a failed spawn, as for an item.
_DIE_WITH_KEEPER = (
    "import ctypes, os, sys\n"
    "if ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0) != 0"
    " or os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(70)\n"
    "os.set_inheritable(int(sys.argv[2]), False)\n"
    "try:\n"
    "    os.execv(sys.argv[3], sys.argv[4:])\n"
    "except OSError as exc:\n"
    "    os.write(int(sys.argv[2]), str(exc.errno or 5).encode())\n"
    "os._exit(127)\n"
)
EXEC_FD = 4  # in that step: past the worker's stdin, stdout, stderr and reply pipe (3)


def spawn_bound(
    programs: dict[str, str], argv: list[str], env: dict[str, str], actions: list[tuple[Any, ...]]
) -> tuple[int, int]:
    """``spawn_found`` for a persistent worker, which dies with this process
    (the parent-death signal, set by a small Python step before its exec).
    Its program is looked up here, so a missing one fails the spawn (ENOENT),
    as it would for an item's command, instead of the step. Returns its pid
    and the read end of the pipe its exec's errno comes on (``exec_error``)."""
    name = argv[0]
    path = name if "/" in name else programs.get(name) or find_program(name)
    if not path or not os.access(path, os.X_OK) or os.path.isdir(path):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name)
    read_end, write_end = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    if write_end == EXEC_FD:  # dup2 onto itself would leave it close-on-exec
        write_end = os.dup(EXEC_FD)
        os.close(EXEC_FD)
    pid = str(os.getpid())
    step = [sys.executable, "-I", "-S", "-c", _DIE_WITH_KEEPER, pid, str(EXEC_FD), path, *argv]
    try:
        child = os.posix_spawn(
            sys.executable,
            step,
            env,
            file_actions=[*actions, (os.POSIX_SPAWN_DUP2, write_end, EXEC_FD)],
            setsid=True,
            setsigdef=RESET_SIGNALS,
        )
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    return child, read_end


def exec_error(fd: int) -> int:
    """The errno a worker's exec failed with (read off ``spawn_bound``'s pipe,
    which is closed here), or 0 if it started its program. Once the worker
    has ended, nothing holds the pipe's write end: this never blocks."""
    try:
        data = os.read(fd, 16)
    except OSError:
        data = b""
    os.close(fd)
    return int(data) if data.isdigit() else 0


def children() -> list[int]:
    """The keeper's children (zombies included)."""
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children", "rb") as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        pass  # CONFIG_PROC_CHILDREN is off: scan every process
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fd = os.open(f"/proc/{name}/stat", os.O_RDONLY)
            try:
                stat = os.read(fd, 1024)
            finally:
                os.close(fd)
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split(b" ", 2)
        if len(fields) > 1 and int(fields[1]) == me:
            found.append(int(name))
    return found


def become_subreaper() -> None:
    """Orphaned descendants reparent to us (Linux >= 3.4); elsewhere, to init."""
    pr_set_child_subreaper = 36
    with suppress(ImportError, OSError, AttributeError):
        import ctypes  # lazy: start-up time of the keeper, and ctypes may be missing

        ctypes.CDLL(None, use_errno=True).prctl(pr_set_child_subreaper, 1, 0, 0, 0)


def report_cpu(path: str) -> None:
    """Write this process's own user+sys CPU seconds to ``path`` (if set)."""
    if not path:
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with suppress(OSError), open(path, "w", encoding="ascii") as f:
        f.write(f"{usage.ru_utime + usage.ru_stime:.6f}\n")


def append_cpu(path: str, role: str) -> None:
    """Append ``ROLE SECONDS`` (this process's own user+sys CPU) to ``path`` (if set)."""
    if not path:
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with suppress(OSError), open(path, "a", encoding="ascii") as f:
        f.write(f"{role} {usage.ru_utime + usage.ru_stime:.6f}\n")
