"""``python -m bench``: run every benchmark and print one line per figure."""

from __future__ import annotations

import os
import platform

from bench import auth, cron, engine, growth, reconciler, submit, wakeups, workers


def main() -> None:
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, {platform.platform()}")
    submit.main([])
    workers.main([])
    engine.main([])
    reconciler.main([])
    wakeups.main([])
    cron.main([])
    auth.main([])
    growth.main([])


if __name__ == "__main__":
    main()
