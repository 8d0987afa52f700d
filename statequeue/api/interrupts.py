"""Ctrl-C held back across a store call that claims an item.

A KeyboardInterrupt can land at any line: inside a claim after its start
record was written, or inside ``done()`` after the result and the next claim
were committed, before the loop knows that claim. The loop could then not
give the item back, and recovery counted an interrupted attempt of an item
the program never saw. Inside ``deferred_interrupt()`` a first SIGINT is
noted and raised once the call returned (its claim is then the loop's to
give back); a second one raises at once, so a call that hangs can still be
left. Only in the main thread (the only one Python raises it in), and only
while SIGINT has Python's default handler (a program's own is left alone).
"""

from __future__ import annotations

# The C module under ``signal``: its wrappers convert to and from enums, ~6 us
# a call, and this runs twice per item of a work() loop.
import _signal  # type: ignore[import-not-found]  # no stub; the same functions as signal's
import threading
from types import FrameType, TracebackType

__all__ = ["deferred_interrupt"]


class deferred_interrupt:  # used as a statement: `with deferred_interrupt():`
    """``with deferred_interrupt():`` see the module docstring."""

    __slots__ = ("_hit", "_old")

    def __enter__(self) -> deferred_interrupt:
        self._old = None
        self._hit = False
        if (
            _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler
            and threading.current_thread() is threading.main_thread()
        ):
            self._old = _signal.signal(_signal.SIGINT, self._note)
        return self

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self._hit:
            raise KeyboardInterrupt  # the second: at once
        self._hit = True

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._old is None:
            return
        _signal.signal(_signal.SIGINT, self._old)
        if self._hit and kind is None:
            raise KeyboardInterrupt
