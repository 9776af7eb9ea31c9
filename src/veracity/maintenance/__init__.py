"""Periodic services. Each is a small class with ``run_once()`` (what tests call) and a
trivial loop around it; each tick runs under a single-runner lock and skips if it is busy."""
