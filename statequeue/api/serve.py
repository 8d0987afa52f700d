"""``statequeue.serve(fn)``: one worker file for both ways ``run`` starts a worker.

Under ``statequeue run --persistent`` (``STATEQUEUE_WORKER`` set) the worker starts once
per slot and pays for its imports once: it reads one JSON request per line on stdin and
answers each on the file descriptor ``STATEQUEUE_REPLY_FD``. Started once per item
(``run -- python worker.py {}``) or by hand (``python worker.py a.pdf b.pdf``), the same
file handles its argv items one at a time. ``statequeue help workers`` is the protocol.
"""

from __future__ import annotations

import base64
import binascii
import os
import sys
import traceback
from collections.abc import Callable, Iterable
from typing import Any, BinaryIO, NoReturn, TypeGuard

import orjson

from statequeue.core.errors import TryLater
from statequeue.core.rates import MAX_DEFER, TRY_LATER_EXIT, delay_problem
from statequeue.core.records import json_problem

WORKER_ENV = "STATEQUEUE_WORKER"
"""Set (to 1) by ``run --persistent``: requests come on stdin, not in argv."""
REPLY_FD_ENV = "STATEQUEUE_REPLY_FD"
"""The number of the file descriptor a persistent worker writes its replies to."""
RESULT_ENV = "STATEQUEUE_RESULT"
"""Per-item mode: the path where ``run`` reads the item's JSON result."""
TOKEN_ENV = "STATEQUEUE_LEASE_TOKEN"
"""The claim's fencing token, on stores that fence (a request's ``token``)."""

Reply = dict[str, Any]
_UNSET = object()
_TOKEN_KEY = os.fsencode(TOKEN_ENV)
_FS_ENCODING, _FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()


def serve(fn: Callable[[str], Any]) -> NoReturn:
    """Call ``fn(item)`` for each item ``run`` gives this worker, then exit.

    Each return value is the item's result (it must be a value JSON can hold); an
    exception fails the attempt with "Type: message" as its reason, and its traceback
    goes to stderr, the attempt's log. Under ``run --persistent`` the items come as
    requests on stdin and the exit status is 0 at the end of stdin; otherwise they are
    ``sys.argv[1:]``, each result goes to ``$STATEQUEUE_RESULT`` when that is set (one
    item: its result; several: a list, null where one failed) and is printed as a JSON
    line otherwise, and the exit status is 0 if every item succeeded, 1 if not.

    ``raise statequeue.TryLater(seconds)`` in fn asks for the item to be tried later in
    both modes, without spending a retry: a ``later`` reply under ``--persistent``; with
    one argv item, exit status 75 and ``{"retry_after": seconds}`` in
    ``$STATEQUEUE_RESULT`` (seconds None: run's adaptive backoff).

    Like ``unittest.main()``, it ends the program (``SystemExit``): it is a worker's main.
    """
    if os.environ.get(WORKER_ENV):
        raise SystemExit(_serve_requests(fn))
    raise SystemExit(_serve_argv(fn, sys.argv[1:]))


def _attempt(fn: Callable[[str], Any], item: str) -> Reply:
    """One attempt of ``item``: ``{"ok": True, "result": ...}`` or ``{"ok": False,
    "reason": ...}``, the reply without its id. Only an ``Exception`` fails the
    attempt: SystemExit and KeyboardInterrupt end the worker, as they would end a
    per-item one, and ``run`` then counts the attempt as interrupted."""
    try:
        value = fn(item)
    except TryLater as exc:  # not a failure: run defers the item (exit 75 per item)
        return _later(exc)
    except Exception as exc:
        # lazy: api.work brings the store's interface, some 40 ms of a worker's start
        from statequeue.api.work import failure_reason

        traceback.print_exc()  # to stderr: the attempt's log, and its stderr tail
        return {"ok": False, "reason": _json_text(failure_reason(exc))}
    problem = None if value is None else json_problem(value)
    if problem is not None:
        return {"ok": False, "reason": f"result cannot be stored as JSON: {problem}"}
    return {"ok": True, "result": value}


def _later(exc: TryLater) -> Reply:
    """The reply for ``TryLater``: ``{"later": seconds}`` (null: run's adaptive
    backoff), or a failure when its seconds are no number >= 0 (which run would
    refuse as a bad reply, stopping the worker)."""
    seconds = exc.seconds
    problem = delay_problem(seconds)  # the library's rule (work(), map()): one for all
    if problem is not None:
        return {"ok": False, "reason": _json_text(problem)}
    if seconds is not None and seconds > MAX_DEFER:
        seconds = MAX_DEFER  # as long an ask as any (10**400 is past JSON's numbers)
    reply: Reply = {"later": seconds}
    if exc.message != (TryLater.__doc__ or "").strip():  # a message of its own
        reply["reason"] = _json_text(exc.message)
    return reply


def _request_item(request: Any) -> tuple[int, str]:
    """(id, item) of one parsed request line; ValueError naming what is wrong.

    ``item_b64`` (sent when the item's bytes are not UTF-8) wins over ``item`` and is
    decoded as ``os.fsdecode`` decodes argv: fn gets the same ``str`` (undecodable
    bytes as surrogate escapes) that a per-item worker finds in ``sys.argv``."""
    if not isinstance(request, dict):
        raise ValueError("a request is a JSON object")
    request_id = request.get("id")
    if not _is_int(request_id):
        raise ValueError('a request needs an integer "id"')
    for key in ("attempt", "token"):
        if key in request and not _is_int(request[key]):
            raise ValueError(f'"{key}" is not an integer')
    if "item_b64" in request:
        try:
            item = os.fsdecode(base64.b64decode(request["item_b64"], validate=True))
        except (TypeError, binascii.Error) as exc:
            raise ValueError(f'"item_b64" is not base64: {exc}') from None
    elif isinstance(request.get("item"), str):
        item = request["item"]
    else:
        raise ValueError('a request needs a string "item" (or "item_b64")')
    # Neither argv nor the environment (STATEQUEUE_ITEM) can hold it: never an item. (A
    # lone surrogate cannot come: orjson refuses one, and fsdecode makes only escapes.)
    if "\0" in item:
        raise ValueError("the item holds a NUL")
    return request_id, item


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _serve_requests(fn: Callable[[str], Any]) -> int:
    try:
        named = int(os.environ.get(REPLY_FD_ENV, ""))
        # A copy that what fn starts does not inherit (PEP 446): only we write replies.
        reply_fd = os.dup(named)
    except (ValueError, OSError):
        return _refuse(f"{WORKER_ENV} is set but {REPLY_FD_ENV} is not an open file descriptor")
    if named > 2:  # by hand it may be 1 or 2: those stay what they are, the logs
        os.close(named)
    requests = _take_stdin()
    # A worker that fn starts is an ordinary program again, not this slot's worker.
    for name in (WORKER_ENV, REPLY_FD_ENV):
        os.environ.pop(name, None)
    return _answer(fn, requests, reply_fd)


def _take_stdin() -> BinaryIO:
    """The request stream, moved off fd 0, which becomes /dev/null: fn and its children
    read stdin as a per-item worker's would, and cannot swallow the next request."""
    requests = os.dup(0)  # dup: not inherited by children (PEP 446)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return open(requests, "rb")


def _answer(fn: Callable[[str], Any], requests: Iterable[bytes], reply_fd: int) -> int:
    env = _ItemEnv()
    try:
        for number, line in enumerate(requests, 1):
            try:
                request = orjson.loads(line)
                request_id, item = _request_item(request)
            except (orjson.JSONDecodeError, ValueError) as exc:
                return _refuse(f"request line {number} refused: {exc}")
            env.set(item, request_id, request.get("attempt", ""), request.get("token"))
            reply = {"id": request_id, **_attempt(fn, item)}
            _flush_logs()  # before the reply: what fn printed belongs to this attempt's log
            try:
                _write_all(reply_fd, orjson.dumps(reply, option=orjson.OPT_APPEND_NEWLINE))
            except OSError as exc:  # the runner is gone; its keeper stops this worker anyway
                return _refuse(f"reply not sent: {exc.strerror}", code=1)
        return 0
    finally:
        env.close()


class _ItemEnv:
    """The variables a per-item child gets, set for each request, so that fn and what it
    starts find the same environment in both modes (the result goes in the reply). In
    the process's environment, not only in ``os.environ``: the keeper tells which item a
    process left behind by fn belongs to by the STATEQUEUE_ID it inherited (promise 4).

    Not with ``os.environ[name] = value``: glibc's setenv keeps every value it was ever
    given (some 140 bytes a request, for ever). libc's putenv instead puts a string of
    ours in the environment, which we drop once it is replaced (one request later, so
    that a thread of fn's that read the old value just before has it a while longer),
    and ``os.environ`` is told the value without a second, copying setenv."""

    def __init__(self) -> None:
        self._putenv = _libc_putenv()
        data = getattr(os.environ, "_data", None)  # what os.environ reads: bytes to bytes on POSIX
        self._data: dict[bytes, bytes] | None = data if isinstance(data, dict) else None
        self._current: dict[bytes, bytes] = {}  # name -> our "NAME=value" in the environment
        self._previous: list[bytes] = []  # replaced one request ago (see above)
        self._attempt: object = _UNSET
        self._token: object = _UNSET

    def set(self, item: str, item_id: int, attempt: object, token: object) -> None:
        """The variables of the request for ``item``: most often only its text and id change."""
        replaced: list[bytes] = []
        self._put(b"STATEQUEUE_ITEM", item, replaced)  # a surrogate escape goes back to its byte
        self._put(b"STATEQUEUE_ID", str(item_id), replaced)
        if attempt != self._attempt:
            self._attempt = attempt
            self._put(b"STATEQUEUE_ATTEMPT", str(attempt), replaced)
        if token != self._token:
            self._token = token
            if token is None:
                os.environ.pop(TOKEN_ENV, None)
                if (entry := self._current.pop(_TOKEN_KEY, None)) is not None:
                    replaced.append(entry)
            else:  # stores that fence (PostgreSQL): for fn's own fencing
                self._put(_TOKEN_KEY, str(token), replaced)
        self._previous = replaced

    def _put(self, key: bytes, value: str, replaced: list[bytes]) -> None:
        if self._putenv is None or self._data is None:
            os.environ[os.fsdecode(key)] = value  # no libc to call: setenv, and its leak
            return
        encoded = value.encode(_FS_ENCODING, _FS_ERRORS)  # as os.fsencode, without its checks
        entry = key + b"=" + encoded
        if self._putenv(entry) != 0:
            raise MemoryError("putenv failed")
        self._data[key] = encoded
        if (old := self._current.get(key)) is not None:
            replaced.append(old)
        self._current[key] = entry  # alive while the environment points at it

    def close(self) -> None:
        """Give the values back to setenv's copies: ours are freed with this object,
        which may be before the last reader of the environment (an atexit handler)."""
        for key in self._current:
            value = os.environb.get(key)
            if value is not None:
                os.putenv(key, value)
        self._current.clear()
        self._previous = []


def _libc_putenv() -> Callable[[bytes], int] | None:
    """libc's putenv (None if ctypes cannot reach it)."""
    try:
        # lazy: some 2 ms, for the persistent mode only
        import ctypes
    except ImportError:  # an interpreter built without ctypes
        return None
    try:
        putenv = ctypes.CDLL(None, use_errno=True).putenv
    except (OSError, AttributeError):
        return None
    putenv.argtypes = [ctypes.c_char_p]
    putenv.restype = ctypes.c_int
    function: Callable[[bytes], int] = putenv
    return function


def _serve_argv(fn: Callable[[str], Any], items: list[str]) -> int:
    replies = []
    for item in items:
        reply = _attempt(fn, item)
        if "later" in reply:
            print(f"{item}: try later ({_delay_text(reply['later'])})", file=sys.stderr)
        elif not reply["ok"]:
            print(f"{item}: {reply['reason']}", file=sys.stderr)
        elif RESULT_ENV not in os.environ:
            print(orjson.dumps(reply["result"]).decode())
        replies.append(reply)
    _flush_logs()
    path = os.environ.get(RESULT_ENV)
    if len(replies) == 1 and "later" in replies[0]:
        # As a per-item command asks: exit 75, its seconds as the result's retry_after.
        seconds = replies[0]["later"]
        if path and seconds is not None:
            try:
                with open(path, "wb") as result_file:
                    result_file.write(orjson.dumps({"retry_after": seconds}))
            except OSError as exc:
                return _refuse(f"result not written to {path}: {exc.strerror}", code=1)
        return TRY_LATER_EXIT
    failed = any(not reply.get("ok") for reply in replies)  # several: a later is not done
    if path and replies and not (failed and len(replies) == 1):
        results = [reply.get("result") for reply in replies]
        try:
            with open(path, "wb") as result_file:
                result_file.write(orjson.dumps(results[0] if len(results) == 1 else results))
        except OSError as exc:
            return _refuse(f"result not written to {path}: {exc.strerror}", code=1)
    return 1 if failed else 0


def _delay_text(seconds: float | None) -> str:
    return "after a backoff" if seconds is None else f"after {seconds:g}s"


def _flush_logs() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105 (suppress() would cost a context manager per request)
            stream.flush()
        except (OSError, ValueError):  # a closed or broken log must not cost the reply
            pass


def _write_all(fd: int, data: bytes) -> None:
    written = os.write(fd, data)
    if written < len(data):  # a pipe takes a long reply in parts
        view = memoryview(data)[written:]
        while view:
            view = view[os.write(fd, view) :]


def _json_text(text: str) -> str:
    """``text`` as JSON can hold it: a lone surrogate (an undecodable file name in an
    exception's message, say) is written as its escape instead of failing the reply."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _refuse(message: str, code: int = 2) -> int:
    print(f"statequeue.serve: {message}", file=sys.stderr)
    return code
