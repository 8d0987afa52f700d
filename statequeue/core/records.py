"""The journal's record format: one JSON object per line, checksummed.

A record is the orjson encoding of a dict with a ``seq`` field, with a CRC32
of those bytes appended as a last ``crc`` field::

    {"seq":7,"t":"enq","id":3,"item":"a.pdf","crc":"1c291ca3"}

The line stays valid JSON (so ``jq`` reads the journal), and the checksum
covers exactly the bytes before it, so checking it costs no re-encoding.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import sys
import zlib
from array import array
from collections.abc import Iterable, Iterator
from itertools import repeat
from typing import Any

import orjson

from statequeue.core.errors import InvalidResult

_CRC_PREFIX = b',"crc":"'
_SUFFIX_LEN = len(_CRC_PREFIX) + 8 + 2  # ,"crc":"xxxxxxxx"}
_crc32 = zlib.crc32
_loads = orjson.loads

Record = dict[str, Any]


class OutOfReach(ValueError):
    """An intact record that replay must not apply (``state.out_of_reach``):
    the journal reports its line as damage."""


def encode(record: Record) -> bytes:
    """Encode one record (which must hold ``seq``) as a checksummed line."""
    raw = orjson.dumps(record)
    return b'%s%s%08x"}\n' % (raw[:-1], _CRC_PREFIX, zlib.crc32(raw))


def encode_enqueued(
    first_id: int, first_seq: int, texts: list[str], at: float | None = None
) -> tuple[bytes, list[int]] | None:
    """The ``enq`` lines for ``texts`` (ids and seqs counting up from the firsts),
    byte for byte what ``encode`` makes of ``{"t": "enq", "id", "item", "seq"}``,
    built without a dict per item, joined, with each line's length; the first
    line also carries ``at`` (the batch's enqueue time, once per batch: the
    lines after it share it, see ``enqueue_times``). None if a text is not
    valid UTF-8 (then the caller falls back to ``encode``, which stores it as
    ``itemx``)."""
    if not texts:
        return b"", []
    try:
        joined = orjson.dumps(texts)
    except orjson.JSONEncodeError:
        return None
    # Inside a JSON string a quote is always escaped, so '","' only ever
    # separates elements: one encode call, split into each text's JSON body.
    bodies = joined[2:-2].split(b'","')
    n = len(texts)
    if len(bodies) != n:
        return None
    # Two formatting passes over the whole batch instead of two per item: the
    # records without their checksum (JSON never holds a raw newline, so they
    # split back apart), then each with its crc field.
    args: list[object] = [None] * (3 * n)
    args[0::3] = range(first_id, first_id + n)
    args[1::3] = bodies
    args[2::3] = range(first_seq, first_seq + n)
    raws = ((b'{"t":"enq","id":%d,"item":"%s","seq":%d\n' * n) % tuple(args)).split(b"\n")
    raws.pop()
    if at is not None:
        raws[0] += b',"at":' + orjson.dumps(round(at, 3))
    crc32 = zlib.crc32
    parts: list[object] = [None] * (2 * n)
    parts[0::2] = raws
    parts[1::2] = _hex_crcs(map(crc32, repeat(b"}"), map(crc32, raws)))
    data = (b'%s,"crc":"%s"}\n' * n) % tuple(parts)
    return data, [len(raw) + _SUFFIX_LEN + 1 for raw in raws]


def _hex_crcs(crcs: Iterable[int]) -> list[bytes]:
    """Each CRC as its 8 hex digits, as ``%08x`` makes them, in one C-level
    pass (bytes formatting makes a str per ``%08x``; ``%s`` of bytes is a copy)."""
    packed = array("I", crcs)  # a C unsigned int: 32 bits on every platform CPython runs on
    if sys.byteorder == "little":
        packed.byteswap()  # digits in the order of the number, most significant first
    return packed.tobytes().hex(" ", 4).encode().split(b" ")


def enqueue_times(records: Iterable[Record], only: int | None = None) -> Iterator[Record]:
    """``records``, each ``enq`` record that has no time given its batch's: the
    time the batch's first ``enq`` record carries, for the ``enq`` records
    that directly follow it (a batch is written as one run of lines). Records
    of old journals, written before enqueue times, stay without one. With
    ``only``, just that item's record is completed (the others pass as they are)."""
    batch_at: object = None
    for rec in records:
        if rec.get("t") != "enq":
            batch_at = None
        elif "at" in rec:
            batch_at = rec["at"]
        elif batch_at is not None and (only is None or rec.get("id") == only):
            rec = {**rec, "at": batch_at}
        yield rec


def decode(line: bytes) -> Record | None:
    """Decode one line (without its newline). Returns None unless it is intact."""
    if len(line) <= _SUFFIX_LEN or line[-_SUFFIX_LEN:-10] != _CRC_PREFIX or line[-2:] != b'"}':
        return None
    # crc32 of the bytes before the crc field plus a closing brace (crc32
    # continues from a previous value), formatted as the writer did: this also
    # refuses digits in any other form (upper case, signs, spaces).
    if b"%08x" % _crc32(b"}", _crc32(line[:-_SUFFIX_LEN])) != line[-10:-2]:
        return None
    try:
        record = _loads(line)
    except orjson.JSONDecodeError:
        return None
    if type(record) is not dict or type(record.get("seq")) is not int:
        return None
    del record["crc"]
    return record


def item_fields(item: str) -> Record:
    """The JSON fields that store ``item``.

    Text that is valid UTF-8 is stored as ``item``. Anything else (file names
    read from stdin may hold arbitrary bytes; they arrive here as surrogate
    escapes) is stored losslessly as base64 in ``itemx``.
    """
    if item.isascii():
        return {"item": item}
    try:
        item.encode("utf-8")
    except UnicodeEncodeError:
        return {"itemx": base64.b64encode(os.fsencode(item)).decode("ascii")}
    return {"item": item}


def item_text(record: Record) -> str:
    """The item stored in ``record`` by ``item_fields``."""
    text = record.get("item")
    if isinstance(text, str):
        return text
    return os.fsdecode(base64.b64decode(record["itemx"]))


RESULT_MAX_DEPTH = 250
"""How deep a result may nest (a list or object counts one level). orjson
writes at most 254 levels, and the deepest place a result is ever written,
`show --json` of a compacted item (``{"events": [{"last": {"result": ...}}]}``),
wraps it in 4 more; an export line wraps it in 3 (``{"history": [{"result":
...}]}``), a journal record in 1 (``end``, ``arch``) or 2 (a compacted item's
``last``)."""


def check_json(value: Any, what: str = "result") -> None:
    """InvalidResult, naming the problem (``json_problem``), unless ``value``
    can go in every record that may hold it. The one check for every way a
    result arrives: a result file, ``done()``/``fail()``, ``map()``, import."""
    problem = json_problem(value)
    if problem is not None:
        raise InvalidResult(f"{what} cannot be stored as JSON: {problem}")


def check_reason(reason: object) -> None:
    """InvalidResult unless ``reason`` is a str JSON can hold: every reader
    (`results`, `status`, an export's import) takes a reason as text."""
    if not isinstance(reason, str):
        raise InvalidResult(f"reason must be a str, not {type(reason).__name__}")
    check_json(reason, "reason")


def json_problem(value: Any, *, parsed: bool = False) -> str | None:
    """Why ``value`` cannot be stored, or None: orjson refuses sets, non-str
    keys, lone surrogates and integers past 64 bits; JSON has no NaN or
    infinity (orjson would write null); and nesting past RESULT_MAX_DEPTH
    cannot be written inside its records. ``parsed``: ``value`` came from
    orjson.loads, which never makes NaN or infinity (the walk is skipped)."""
    if value is None:  # no result (most commands): nothing to check
        return None
    if type(value) is str:  # a reason, or a text result: only a lone surrogate fails
        try:
            orjson.dumps(value)
        except orjson.JSONEncodeError as exc:
            return _problem(exc)
        return None
    # Encoded as deep as it is ever written, so a value that passes here can
    # never fail later inside a record, an archive or export line, or `show`.
    try:
        encoded = orjson.dumps({"events": [{"last": {"result": value}}]})
    except orjson.JSONEncodeError as exc:
        return _problem(exc)
    # orjson writes NaN and infinities as null: only then is the walk needed.
    if not parsed and b"null" in encoded and _has_non_finite(value):
        return "NaN or infinity (JSON has no such number)"
    return None


def load_result(raw: bytes) -> Any:
    """``raw`` parsed as JSON (orjson.JSONDecodeError if it is not), or
    InvalidResult where orjson would silently turn an integer past 64 bits
    into a float of another value."""
    value = orjson.loads(raw)
    if _LONG_DIGITS.search(raw) is not None and _has_wide_integer(raw):
        raise InvalidResult("result cannot be stored as JSON: an integer exceeds the 64-bit range")
    return value


# i64 min has 19 digits: a shorter run of digits is an integer orjson keeps exactly.
_LONG_DIGITS = re.compile(rb"\d{19,}")
_I64_MIN, _U64_END = -(1 << 63), 1 << 64


def _has_wide_integer(raw: bytes) -> bool:
    """True if an integer literal in ``raw`` (not a digit run in a string or a
    fraction) is outside what orjson reads as an integer. Only reached for
    input with a long run of digits: the stdlib parser is slower but tells
    integer literals apart."""
    found = False

    def integer(text: str) -> int:
        nonlocal found
        # Never int() a long text: Python refuses past 4300 digits.
        if len(text.lstrip("-")) > 20 or not _I64_MIN <= int(text) < _U64_END:
            found = True
        return 0

    try:
        json.loads(raw, parse_int=integer)
    except (ValueError, RecursionError):  # orjson's reading stands
        return False
    return found


def _problem(exc: orjson.JSONEncodeError) -> str:
    text = str(exc)
    if text.startswith("Recursion limit"):
        return f"nested deeper than {RESULT_MAX_DEPTH} levels"
    return text


def _has_non_finite(value: Any) -> bool:
    """True if a float in ``value`` (through dicts, lists and tuples) is NaN or infinite."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_has_non_finite(v) for v in value)
    return False
