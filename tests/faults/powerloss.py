"""A file layer that remembers what is durable, and builds what a power cut leaves.

The model (after SQLite's test6.c and the ALICE paper):
- a file's bytes are durable up to its last fsync; bytes written since may be
  lost, kept, torn at any length, or garbled;
- a rename (or a create) is durable only after an fsync of its folder; before
  that, the name may still point at the old file;
- a cut can also happen *inside* an operation: ``cut_at`` raises PowerCut at
  the k-th operation, after a short write lands only half its bytes.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path

from statequeue.core.fileio import FileOps

WATCHED = ("journal.jsonl", "archive.jsonl")


class PowerCut(BaseException):
    """The machine lost power: nothing after this runs (not caught as an error)."""


@dataclass
class Variant:
    """How the unsynced state is resolved at the cut."""

    tail: str = "drop"  # drop | keep | torn | garble
    lose_renames: bool = False
    seed: int = 0


@dataclass
class PowerLossOps(FileOps):
    folder: Path
    cut_at: int | None = None
    ops: int = 0
    durable: dict[int, bytes] = field(default_factory=dict)  # inode -> synced bytes
    names: dict[str, int] = field(default_factory=dict)  # name -> inode, as dir-synced
    replaced: dict[int, bytes] = field(default_factory=dict)  # unlinked inode -> last bytes

    def __post_init__(self) -> None:
        for name in WATCHED:
            path = self.folder / name
            if path.exists():
                ino = path.stat().st_ino
                self.durable[ino] = path.read_bytes()
                self.names[name] = ino

    def _tick(self) -> bool:
        self.ops += 1
        return self.cut_at is not None and self.ops == self.cut_at

    def write_all(self, fd: int, data: bytes) -> None:
        if self._tick():
            super().write_all(fd, data[: len(data) // 2])
            raise PowerCut
        super().write_all(fd, data)

    def fsync(self, fd: int) -> None:
        if self._tick():
            raise PowerCut
        super().fsync(fd)
        with open(f"/proc/self/fd/{fd}", "rb") as f:  # fd may be write-only
            self.durable[os.fstat(fd).st_ino] = f.read()

    def replace(self, src: str, dst: str) -> None:
        if self._tick():
            raise PowerCut
        try:
            old = os.stat(dst).st_ino
            with open(dst, "rb") as f:
                self.replaced[old] = f.read()
        except FileNotFoundError:
            pass
        super().replace(src, dst)

    def fsync_dir(self, path: str) -> None:
        if self._tick():
            raise PowerCut
        super().fsync_dir(path)
        if Path(path) == self.folder:
            for name in WATCHED:
                p = self.folder / name
                if p.exists():
                    self.names[name] = p.stat().st_ino

    def truncate(self, fd: int, size: int) -> None:
        super().truncate(fd, size)

    def after_cut(self, variant: Variant) -> dict[str, bytes | None]:
        """The content each watched file has after the cut (None: the name is gone)."""
        rng = random.Random(variant.seed)
        out: dict[str, bytes | None] = {}
        for name in WATCHED:
            path = self.folder / name
            current = path.stat().st_ino if path.exists() else None
            synced_name = self.names.get(name)
            ino = synced_name if variant.lose_renames else current
            if ino is None:
                ino = current if current is not None else synced_name
            if ino is None:
                out[name] = None
                continue
            durable = self.durable.get(ino)
            if ino != current:  # the name reverted to a replaced file
                out[name] = durable if durable is not None else self.replaced.get(ino)
                continue
            live = path.read_bytes()
            base = durable or b""
            out[name] = _resolve(base, live, variant.tail, rng) if live.startswith(base) else base
        return out


def _resolve(base: bytes, live: bytes, tail: str, rng: random.Random) -> bytes:
    extra = live[len(base) :]
    if not extra or tail == "drop":
        return base
    if tail == "keep":
        return live
    n = rng.randint(1, len(extra))
    if tail == "torn":
        return base + extra[:n]
    return base + rng.randbytes(n)


def apply_cut(folder: Path, contents: dict[str, bytes | None]) -> None:
    """Lay the post-cut contents down (the test's stand-in for rebooting)."""
    for name, data in contents.items():
        path = folder / name
        if data is None:
            path.unlink(missing_ok=True)
        else:
            path.write_bytes(data)
