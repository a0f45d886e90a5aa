"""The `triad` command: thin entry points that parse config first, import heavy modules late."""
