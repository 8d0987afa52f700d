"""The part of the store contract (base.py) that only stores with leases
fill in: claims that expire unless renewed, fencing of a frozen runner's
children, patience with a lost connection (PostgreSQL). The defaults here say
"no leases": a local claim lasts exactly as long as the processes holding it.
"""

from __future__ import annotations

from statequeue.core.durations import MAX_DURATION, MAX_DURATION_TEXT
from statequeue.core.errors import UsageError
from statequeue.core.models import Claim

DEFAULT_LEASE = 30.0
"""Seconds a claim's lease lasts, for stores with leases (``run --lease``)."""
MIN_LEASE = 0.5
"""Shorter leases leave no room for a renew round trip and the fencing margin."""


def check_lease(seconds: object) -> None:
    """UsageError unless ``seconds`` is a lease a store can keep: a number
    from MIN_LEASE up to MAX_DURATION (``Queue(lease=inf)`` once failed later,
    in a heartbeat thread's traceback and a store failure)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise UsageError(f"the lease must be a number of seconds, not {seconds!r}")
    if not MIN_LEASE <= seconds <= MAX_DURATION:  # NaN too: no comparison holds
        raise UsageError(
            f"the lease must be a finite number of seconds from {MIN_LEASE:g} up to"
            f" {MAX_DURATION_TEXT}, not {seconds!r}"
        )


class LeaseHooks:
    """Lease hooks of ``Store``, with the defaults of stores without leases."""

    def heartbeat(self, claim: Claim) -> None:
        """Renew ``claim`` for stores whose claims expire (leases); by default
        nothing: a local claim lasts as long as its process."""
        return None

    def use_lease(self, seconds: float) -> None:
        """Make later claims' leases last ``seconds`` (UsageError below
        MIN_LEASE, past MAX_DURATION or not a number, as ``run --lease``).
        Stores without leases (journal, memory) ignore it."""
        check_lease(seconds)

    def handed_over(self, claim: Claim) -> None:
        """``claim.inherit_fds`` were passed on to the process that holds them
        while any process of the item lives (the runner's keeper): close this
        process's copies, so that a frozen runner holds no claim lock after
        its keeper has let go. Not to be used after this. Default: nothing."""
        return None

    def use_patience(self, seconds: float) -> None:
        """How long one call of a runner's store (``register_runner``) keeps
        reconnecting to a store it lost before it raises StoreUnreachable;
        never past ``fence_at``. Stores without a connection ignore it."""
        return None

    def lost_claims(self) -> set[int]:
        """Tokens of this store's claims it can no longer vouch for (a renew
        found them taken, or could not be made in time), each reported once.
        The caller must stop their processes at once (TERM, then KILL after
        ``fence_grace``) and record nothing for them: the item is, or soon
        will be, another runner's. Always empty for stores without leases."""
        return set()

    def fence_at(self) -> float | None:
        """The ``lease_clock.now()`` by which ``lost_claims`` must be asked
        again (when the first held lease needs fencing unless renewed first);
        None while no lease is held."""
        return None

    def kill_by(self, token: int | None) -> float | None:
        """The ``lease_clock.now()`` by which the processes of the claim with
        ``token`` must be dead unless its lease is renewed first (the runner's
        keeper enforces it even if the runner freezes); None: no such lease."""
        return None

    def fence_grace(self, grace: float) -> float:
        """The TERM -> KILL wait when fencing: ``grace``, shortened so that
        the KILL lands before the lease ends."""
        return grace
