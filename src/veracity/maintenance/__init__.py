"""Periodic services. Each is a small class with ``run_once()`` (what tests call) and a
loop around it. Lease recovery and the reconciler tick under a single-runner lock and skip
a tick while another server holds it; cron takes no lock: every server ticks, and a slot's
unique key in the database makes it start once (docs/cron.md)."""
