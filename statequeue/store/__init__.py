"""Stores: where a queue's records live. One interface, several backends."""

from __future__ import annotations

from statequeue.store.base import Store

__all__ = ["Store"]
