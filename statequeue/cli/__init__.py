"""The command line: parse, call the library, render, map errors to exit codes."""
