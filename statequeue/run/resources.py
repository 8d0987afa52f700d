"""Running short of fds, processes or memory: which errors say so, and what a run does then.

A spawn that fails for want of resources is the runner's (or the machine's)
shortage, not the item's fault: the item goes back uncounted and the run runs
fewer at once, or stops with exit 10 and one line of advice.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

from statequeue.core.errors import SHORTAGE_REMEDIES, ResourcesExhausted

__all__ = [
    "RESOURCE_ERRNOS",
    "lowered_concurrency",
    "short_of",
    "stop_when_short_of_resources",
]

# Spawn errors that say the runner (or the machine) is short of something,
# not that the item's command is wrong: the item is given back, uncounted.
# ENOBUFS and ETOOMANYREFS: passing the child's fds to the keeper failed.
RESOURCE_ERRNOS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN, errno.ENOBUFS, errno.ETOOMANYREFS}
)
# What to raise or free for each shortage: `ulimit -n` is no help when the
# spawn failed for want of processes or memory.
_REMEDY = {
    **SHORTAGE_REMEDIES,
    errno.ENOBUFS: SHORTAGE_REMEDIES[errno.EMFILE],
    errno.ETOOMANYREFS: SHORTAGE_REMEDIES[errno.EMFILE],
}


def short_of(what: str, exc: OSError, *, jobs: int) -> ResourcesExhausted:
    """The one line for a run that stops short of resources: ``what`` failed
    for ``exc``, and the remedy for that shortage; lowering --jobs is offered
    only when the run was asked for more than one at once."""
    reason = exc.strerror or str(exc)
    remedy = _REMEDY.get(exc.errno or 0, "raise the limit")
    fewer = ", or lower --jobs" if jobs > 1 else ""
    return ResourcesExhausted(
        f"{what}: {reason}; stopped, the items stay pending ({remedy}{fewer})"
    )


@contextlib.contextmanager
def stop_when_short_of_resources(*, jobs: int = 1) -> Iterator[None]:
    """Turn running out of fds, processes or memory anywhere in a run (opening
    the queue, the runner's own pipes and locks, not only a spawn) into
    ResourcesExhausted: one line and exit 10, not exit 6 ("a write or fsync
    failed"). What the run claimed was given back (``Runner.run`` on an error)."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in RESOURCE_ERRNOS:
            raise
        where = f" ({exc.filename})" if exc.filename else ""
        exc = OSError(exc.errno, f"{exc.strerror or exc}{where}")
        raise short_of("cannot run", exc, jobs=jobs) from None


def lowered_concurrency(
    exc: OSError, running: int, concurrency: int, *, jobs: int
) -> tuple[int, str]:
    """After a spawn short of resources: run as many items at once as run
    now, which fit; returns the new concurrency and the warning to give
    ("" when it is unchanged). With none running there is nothing to wait
    for: ResourcesExhausted (the items stay pending; ``jobs``: --jobs)."""
    if not running:
        raise short_of("cannot start any command", exc, jobs=jobs)
    if running < concurrency:
        reason = exc.strerror or str(exc)
        items = "item" if running == 1 else "items"
        return running, f"warning: {reason}: running at most {running} {items} at once"
    return concurrency, ""
