"""Running short of fds, processes or memory: which errors say so, and what a run does then.

A spawn that fails for want of resources is the runner's (or the machine's)
shortage, not the item's fault: the item goes back uncounted and the run runs
fewer at once, or stops with exit 10 and one line of advice.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

from statequeue.core.errors import ResourcesExhausted

__all__ = [
    "RESOURCE_ERRNOS",
    "SHORT_ADVICE",
    "lowered_concurrency",
    "stop_when_short_of_resources",
]

# Spawn errors that say the runner (or the machine) is short of something,
# not that the item's command is wrong: the item is given back, uncounted.
# ENOBUFS and ETOOMANYREFS: passing the child's fds to the keeper failed.
RESOURCE_ERRNOS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN, errno.ENOBUFS, errno.ETOOMANYREFS}
)
SHORT_ADVICE = (
    "stopped, the items stay pending (raise the limit, e.g. `ulimit -n`, or lower --jobs)"
)


@contextlib.contextmanager
def stop_when_short_of_resources() -> Iterator[None]:
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
        reason = exc.strerror or str(exc)
        raise ResourcesExhausted(f"cannot run: {reason}{where}; {SHORT_ADVICE}") from None


def lowered_concurrency(exc: OSError, running: int, concurrency: int) -> tuple[int, str]:
    """After a spawn short of resources: run as many items at once as run
    now, which fit; returns the new concurrency and the warning to give
    ("" when it is unchanged). With none running there is nothing to wait
    for: ResourcesExhausted (the items stay pending)."""
    reason = exc.strerror or str(exc)
    if not running:
        raise ResourcesExhausted(f"cannot start any command: {reason}; {SHORT_ADVICE}")
    if running < concurrency:
        return running, f"warning: {reason}: running at most {running} items at once"
    return concurrency, ""
