"""Compaction's fast path: the ``arch`` record of an item done at its first
try, spliced from the bytes of its ``enq`` and ``end`` lines.

Nearly every line compaction reads is one of those two, in the exact layout
this package's encoder writes. Decoding both into dicts and encoding the
``arch`` record again cost ~12 us per item; matching them in C and splicing
the JSON fields as they are costs a few. A line in any other layout (an item
stored as ``itemx``, an ``end`` that is not done, an older writer's key
order) is left to the general path, which decodes it.

The ``arch`` record keeps the ``end`` record's fields but ``t``, ``id``,
``state``, ``ok`` and ``seq``, in the ``end`` record's key order; readers go
by key, as for any record.
"""

from __future__ import annotations

import zlib

import orjson

ENQ_PREFIX = b'{"t":"enq","id":'
END_PREFIX = b'{"t":"end","id":'
_ITEM = b',"item":"'
_ATTEMPT = b',"attempt":'
_DONE_OK = b',"state":"done","ok":true,'
_SEQ = b',"seq":'
_crc32 = zlib.crc32
_SUFFIX = len(b',"crc":"') + 8 + 2  # the checksum field and the closing brace

# Found by plain byte searches, not a regular expression (which backtracks
# over the result's JSON): a line whose checksum holds is one the encoder
# wrote, so it is valid JSON, and inside a JSON string a quote is always
# escaped: ``","seq":`` found last is the record's own ``seq`` key, and
# ``,"item":"`` found first after the id is its own ``item`` key.


def _intact(line: bytes) -> bool:
    """The line's checksum holds."""
    return b"%08x" % _crc32(b"}", _crc32(line[:-_SUFFIX])) == line[-10:-2]


def enqueued(line: bytes) -> tuple[int, bytes] | None:
    """(id, the item's JSON string body) of an intact ``enq`` line (which
    starts with ENQ_PREFIX) in the usual layout, else None."""
    start = len(ENQ_PREFIX)
    at = line.find(_ITEM, start)
    end = line.rfind(b'"' + _SEQ)
    if at < 0 or end < at or not line[start:at].isdigit() or not _intact(line):
        return None
    return int(line[start:at]), line[at + len(_ITEM) : end]


def done_at_once(line: bytes) -> tuple[int, bytes] | None:
    """(id, its result's JSON fields) of an intact ``end`` line (which starts
    with END_PREFIX) that made an item done, in the usual layout, else None."""
    start = len(END_PREFIX)
    at = line.find(_ATTEMPT, start)
    done = line.find(_DONE_OK, at)
    end = line.rfind(_SEQ)
    if (
        at < 0
        or done < 0
        or end < done
        or not line[start:at].isdigit()
        or not line[at + len(_ATTEMPT) : done].isdigit()
        or not _intact(line)
    ):
        return None
    return int(line[start:at]), line[at + 1 : done] + line[done + len(_DONE_OK) - 1 : end]


def arch_line(item_id: int, body: bytes, fields: bytes, seq: int) -> bytes:
    """The encoded ``arch`` record of item ``item_id`` (JSON string body
    ``body``) with the result ``fields``, numbered ``seq``."""
    raw = b'{"t":"arch","id":%d,"item":"%s",%s,"seq":%d' % (item_id, body, fields, seq)
    return b'%s,"crc":"%08x"}\n' % (raw, _crc32(b"}", _crc32(raw)))


def text_of(body: bytes) -> str:
    """The item text a JSON string body holds."""
    if b"\\" not in body:
        return body.decode("utf-8")
    text = orjson.loads(b'"%s"' % body)
    assert isinstance(text, str)
    return text
