"""``python -m bench``: run every benchmark and print one line per figure."""

from __future__ import annotations

import os
import platform

from bench import (
    auth,
    batch,
    cron,
    dashboard,
    direct,
    engine,
    generations,
    growth,
    prefix_pages,
    reconciler,
    scaling,
    startup,
    submit,
    waiting,
    wakeups,
    workers,
)


def main() -> None:
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, {platform.platform()}")
    submit.main([])
    direct.main([])
    batch.main([])
    startup.main([])
    workers.main([])
    scaling.main([])
    engine.main([])
    reconciler.main([])
    wakeups.main([])
    cron.main([])
    auth.main([])
    waiting.main([])
    dashboard.main([])
    generations.main([])
    growth.main([])
    prefix_pages.main([])


if __name__ == "__main__":
    main()
