"""The line protocol between the runner and a persistent worker (``run --persistent``).

Requests go to the worker's stdin, one JSON object per line::

    {"id": 17, "item": "a.pdf", "attempt": 1}

``id`` is the item's id (as in ``statequeue show 17``). An item that is not
UTF-8 comes as ``item_b64`` (its bytes, base64) *instead of* ``item``, so a
worker that does not expect such items fails on it rather than working on
mangled text. ``"interrupted": true`` when the item's previous attempt died;
``token`` on stores that fence (PostgreSQL). Replies come on the fd named by
``STATEQUEUE_REPLY_FD``, never on stdout (a stray print cannot break them)::

    {"id": 17, "ok": true, "result": ...}
    {"id": 17, "ok": false, "reason": "...", "result": ...}
    {"id": 17, "later": 12, "reason": "..."}

``later`` asks for the item to be tried later, as a per-item command that
exits 75 (EX_TEMPFAIL) does: seconds (a finite number >= 0), or ``null`` or
``true`` for the runner's adaptive backoff. Such a reply has no ``"ok": true``
and no ``result`` (the runner records it as exit 75 with that
``retry_after``, so the one rule for deferrals applies: recorder.py).

A reply that is not such an object, or names another id, is a protocol
error: the runner stops the worker and fails the attempt with the
``BadReply`` text. A second reply to a request (``ExtraReply``, or a line
after the reply) stops the worker too, but the first reply stands, and the
item the worker had next is not failed for it (persistent.py).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Container
from dataclasses import dataclass
from typing import Any

import orjson

from statequeue.core.errors import InvalidResult
from statequeue.core.models import Claim
from statequeue.core.rates import MAX_DEFER
from statequeue.core.records import json_problem, load_result

__all__ = ["BadReply", "ExtraReply", "Reply", "ReplyReader", "request_line"]

MAX_REPLY_BYTES = 1 << 20  # as a result file (jobs.RESULT_MAX_BYTES), plus room for the rest
_SHOWN = 80  # characters of a bad reply quoted in the reason


def request_line(claim: Claim) -> bytes:
    """The request for ``claim``, as one line."""
    try:
        return orjson.dumps(_request(claim, "item", claim.item), option=orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError:  # surrogate escapes: bytes that are not UTF-8
        raw = claim.item.encode("utf-8", "surrogateescape")  # the item's own bytes
        request = _request(claim, "item_b64", base64.b64encode(raw).decode("ascii"))
        return orjson.dumps(request, option=orjson.OPT_APPEND_NEWLINE)


def _request(claim: Claim, key: str, item: str) -> dict[str, Any]:
    request: dict[str, Any] = {"id": claim.item_id, key: item, "attempt": claim.attempt}
    if claim.interrupted:
        request["interrupted"] = True
    if claim.token is not None:
        request["token"] = claim.token
    return request


@dataclass(frozen=True)
class Reply:
    """A worker's answer to one request."""

    ok: bool
    reason: str = ""
    result: Any = None
    later: bool = False
    """The worker asks for the item to be tried later (a ``later`` reply)."""
    retry_after: float | None = None
    """With ``later``: the seconds it asked for; None: the adaptive backoff."""


class BadReply(Exception):
    """A reply that breaks the protocol; its message says how (for the attempt's reason)."""


class ExtraReply(BadReply):
    """A reply to the request the worker answered before: a second reply (the first stands)."""


class ReplyReader:
    """Splits what a worker writes on its reply pipe into replies, checking each."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def take(self, data: bytes, expected: int, answered: Container[int] = ()) -> Reply | None:
        """``data`` read from the reply pipe while the request ``expected`` is in
        flight: its reply once whole (None before). BadReply if it breaks the
        protocol; ExtraReply if a second reply to one of ``answered`` (requests
        answered before) came first. What came after the reply stays ``pending``: sent
        without a request, it is the caller's to act on, and the reply stands."""
        if not self._buffer and data.find(b"\n") == len(data) - 1:
            return parse_reply(data[:-1], expected, answered)  # the usual: one whole line
        self.feed(data)
        return self.next_reply(expected, answered)

    def feed(self, data: bytes) -> None:
        """Take in bytes read from the reply pipe."""
        self._buffer += data
        if len(self._buffer) > MAX_REPLY_BYTES and b"\n" not in self._buffer:
            raise BadReply(f"reply longer than {MAX_REPLY_BYTES} bytes")

    def pending(self) -> bool:
        """Whether anything is buffered (a reply, or part of one)."""
        return bool(self._buffer)

    def next_reply(self, expected: int | None, answered: Container[int] = ()) -> Reply | None:
        """The next complete reply, checked against the id of the request
        in flight (``expected``; None: no request is); None if no whole
        line has come yet. BadReply if it breaks the protocol (ExtraReply:
        it names one of ``answered``, requests answered before)."""
        end = self._buffer.find(b"\n")
        if end < 0:
            return None
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        if expected is None:
            raise BadReply(f"reply sent without a request: {_quote(line)}")
        return parse_reply(line, expected, answered)


def parse_reply(line: bytes, expected: int, answered: Container[int] = ()) -> Reply:
    """Check one reply line against the id of the request in flight
    (ExtraReply if it names one of ``answered``, requests answered before)."""
    try:
        value = load_result(line)
    except orjson.JSONDecodeError:
        raise BadReply(f"reply is not JSON: {_quote(line)}") from None
    except InvalidResult:
        raise BadReply("reply cannot be stored (an integer exceeds the 64-bit range)") from None
    if not isinstance(value, dict):
        raise BadReply(f"reply is not a JSON object: {_quote(line)}")
    got = value.get("id")
    if got != expected and isinstance(got, int) and not isinstance(got, bool) and got in answered:
        raise ExtraReply(f"a second reply to item {got}: {_quote(line)}")
    if got != expected or isinstance(got, bool):
        raise BadReply(f"reply names id {orjson.dumps(got).decode()[:_SHOWN]}, not {expected}")
    if "later" in value:
        return _later_reply(value, line)
    ok = value.get("ok")
    if not isinstance(ok, bool):
        raise BadReply(f'reply has no "ok": true or false: {_quote(line)}')
    reason = value.get("reason", "")
    if not isinstance(reason, str):
        raise BadReply(f'reply\'s "reason" is not a string: {_quote(line)}')
    result = value.get("result")
    problem = None if result is None else json_problem(result, parsed=True)
    if problem is not None:
        raise BadReply(f"reply's result cannot be stored ({problem})")
    if not ok and not reason:
        reason = "the worker replied ok: false"
    return Reply(ok=ok, reason=reason, result=result)


def _later_reply(value: dict[str, Any], line: bytes) -> Reply:
    """A reply that asks for its item to be tried later; BadReply if malformed."""
    later = value["later"]
    if later is None or later is True:
        seconds = None  # the runner's adaptive backoff
    elif isinstance(later, int | float) and not isinstance(later, bool):
        if not (math.isfinite(later) and later >= 0):
            raise BadReply(f'reply\'s "later" is not a number of seconds >= 0: {_quote(line)}')
        seconds = min(float(later), MAX_DEFER)  # 1e308 overflowed the record's time
    else:
        raise BadReply(
            f'reply\'s "later" is not seconds (a number >= 0), null or true: {_quote(line)}'
        )
    if value.get("ok", False) is not False or "result" in value:
        raise BadReply(f'a "later" reply has no "ok": true and no "result": {_quote(line)}')
    reason = value.get("reason", "")
    if not isinstance(reason, str):
        raise BadReply(f'reply\'s "reason" is not a string: {_quote(line)}')
    return Reply(ok=False, reason=reason, later=True, retry_after=seconds)


def _quote(line: bytes) -> str:
    text = line.decode("utf-8", "replace")
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")
