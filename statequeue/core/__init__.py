"""The bottom layer: errors, exit codes, the values the library returns, the record format, item and
name checks, and file I/O. It imports nothing else of statequeue."""
