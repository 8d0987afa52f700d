"""What ``statequeue run`` can be told, checked once before a run starts.

Kept apart from the runner so that the CLI and the tests can build and check
options without the loop that uses them.
"""

from __future__ import annotations

from dataclasses import dataclass

from statequeue.core.durations import MAX_DURATION, MAX_DURATION_TEXT
from statequeue.core.errors import UsageError
from statequeue.core.models import OnInterrupted
from statequeue.core.rates import DEFAULT_MAX_DEFERRALS, RateLimit
from statequeue.run.checks import check_verify_script
from statequeue.run.replacements import refuse_item_tokens
from statequeue.store.base import MIN_LEASE

__all__ = ["RunOptions", "parse_size", "parse_verify"]

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


@dataclass(frozen=True)
class RunOptions:
    """Everything ``statequeue run`` can be told. Durations are in seconds."""

    command: tuple[str, ...]
    """What runs per item (with ``--shell``: ``/bin/sh -c SCRIPT sh {} ...``)."""
    jobs: int = 1
    timeout: float | None = None
    grace: float = 5.0
    retries: int = 0
    retry_delay: float = 1.0
    retry_max_delay: float = 300.0
    on_interrupted: OnInterrupted = OnInterrupted.RETRY
    max_crashes: int = 3
    verify: str = ""
    """A shell script (see verify.py); "" for none. Checked before an
    interrupted item runs again, and with ``verify_first`` before every first run."""
    verify_first: bool = False
    limit: int | None = None
    max_time: float | None = None
    follow: bool = False
    halt_on_failure: bool = False
    single: bool = False
    item_on_stdin: bool = False
    log_limit: int = 1 << 20
    lease: float | None = None
    """Seconds each claim's lease lasts, for stores with leases (None: the store's default)."""
    give_up_after: float | None = None
    """Seconds the store may stay unreachable before the run stops (StoreUnreachable);
    None: the default (never with ``follow``, 10 minutes without); 0: never (run_outage.py)."""
    rate: RateLimit | None = None
    """At most this many item starts per second for the whole queue (pacing.py); None: no limit."""
    max_deferrals: int = DEFAULT_MAX_DEFERRALS
    """Times an item may ask to be tried later (exit 75) before it fails."""

    given_command: tuple[str, ...] = ()
    """The command as the user gave it, recorded and shown (core/command_text.py:
    ``("--shell", TEXT)`` for ``--shell``); empty: ``command`` itself."""

    persistent: bool = False
    """One long-lived worker per slot, fed items over a line protocol (persistent.py)."""
    recycle_after: int | None = None
    """With ``persistent``: replace a worker after this many items (None: never)."""
    recycle_rss: int | None = None
    """With ``persistent``: replace a worker whose resident memory reaches this many bytes."""

    @property
    def shown_command(self) -> tuple[str, ...]:
        """The command to record and show: as given, else as run."""
        return self.given_command or self.command

    def __post_init__(self) -> None:
        if not self.command:
            raise UsageError("no command given: use `statequeue run -- COMMAND [ARG]...`")
        self._check_persistent()
        if self.jobs < 1:
            raise UsageError("--jobs must be at least 1")
        if not 0 <= self.grace <= MAX_DURATION:  # as every duration option (durations.py)
            raise UsageError(
                f"--grace must be a finite number of seconds up to {MAX_DURATION_TEXT},"
                f" not {self.grace:g}"
            )
        if self.retries < 0 or self.max_crashes < 1:
            raise UsageError("--retries must be >= 0 and --max-crashes >= 1")
        if self.limit is not None and self.limit < 0:
            raise UsageError("--limit must be >= 0")
        if self.log_limit < 0:
            raise UsageError(f"--log-limit must be >= 0 bytes, not {self.log_limit}")
        if self.lease is not None and not self.lease >= MIN_LEASE:
            raise UsageError(f"--lease must be at least {MIN_LEASE:g}s, not {self.lease:g}s")
        if self.give_up_after is not None and not self.give_up_after >= 0:
            raise UsageError(f"--give-up-after must be >= 0, not {self.give_up_after:g}s")
        if self.max_deferrals < 0:
            raise UsageError(f"--max-deferrals must be >= 0, not {self.max_deferrals}")
        if self.verify_first and not self.verify:
            raise UsageError("--verify-first needs --verify SCRIPT")

    @property
    def recovery_policy(self) -> OnInterrupted:
        """The policy the store's recovery applies: with --verify, a policy
        that would settle an item (fail, hold) waits for the check, so the
        item goes back to pending marked crashed, and the run settles it by
        the policy only once the check says it is not done (verify_step.py)."""
        if self.verify and self.on_interrupted is not OnInterrupted.RETRY:
            return OnInterrupted.RETRY
        return self.on_interrupted

    def _check_persistent(self) -> None:
        if not self.persistent:
            if self.recycle_after is not None or self.recycle_rss is not None:
                raise UsageError("--recycle-after and --recycle-rss need --persistent")
            return
        refuse_item_tokens(self.command)
        if self.item_on_stdin:
            raise UsageError("--persistent and --stdin do not go together: stdin carries requests")
        if self.recycle_after is not None and self.recycle_after < 1:
            raise UsageError(f"--recycle-after must be at least 1, not {self.recycle_after}")
        if self.recycle_rss is not None and self.recycle_rss < 1:
            raise UsageError("--recycle-rss must be a positive size")


def parse_verify(script: str) -> str:
    """The ``--verify`` script as ``sh -c`` will run it (see verify.py); a
    UsageError if it is empty or not valid shell."""
    return check_verify_script(script)


def parse_log_limit(text: str) -> int:
    """``--log-limit``: a count of bytes (0 and negatives are RunOptions' to
    judge), or a size with a unit as ``parse_size`` reads it (``500K``, ``1M``)."""
    try:
        return int(text.strip())
    except ValueError:
        return parse_size(text, "--log-limit")


def parse_size(text: str, option: str) -> int:
    """``text`` as a number of bytes: ``123``, ``500K``, ``1.5G`` (powers of
    1024; a trailing B or iB is allowed). A UsageError naming ``option`` if not."""
    raw = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = raw[-1:] if raw[-1:] in _UNITS else ""
    number = raw[: len(raw) - len(unit)]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise UsageError(f"{option} must be a size such as 500M or 2G, not {text!r}")
    return int(value * _UNITS[unit])
