"""The runner: claim items, run the command for each through the keeper, record every result."""
