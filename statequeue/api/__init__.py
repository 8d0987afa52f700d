"""The library: ``Queue``, the ``work()`` loops, ``map`` and whole-queue operations,
over one store."""
