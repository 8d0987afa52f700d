"""Whole-queue operations by name: ``fsck_queue``, ``drop_queue``, ``list_queues``.

Kept at this path, which users call (the `python` help page documents
``statequeue.maintenance.fsck_queue``);
the code lives in ``statequeue.api.maintenance``.
"""

from __future__ import annotations

from statequeue.api.maintenance import drop_queue, fsck_queue, list_queues

__all__ = ["drop_queue", "fsck_queue", "list_queues"]
