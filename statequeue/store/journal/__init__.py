"""The local store: an append-only journal in one folder per queue, with its folder, locks,
checkpoints, caches and compaction."""
