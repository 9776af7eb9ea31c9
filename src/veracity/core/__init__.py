"""The domain core: pure code with no I/O (states, names, decisions)."""
