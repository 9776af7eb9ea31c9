"""Facts about this host that let one process tell that another is gone (docs/workers.md,
"A worker whose process is gone").

A worker registers a *host key*: the kernel's boot id and the inode of its pid namespace.
Two processes with the same key see the same process ids, so one may ask the operating
system about the other's pid; on another host, another boot, or in another container, a pid
means nothing and the key differs. Not on Linux (no ``/proc``): no key, and workers are
recovered only when their leases expire.
"""

from __future__ import annotations

import os
from functools import lru_cache

_BOOT_ID = "/proc/sys/kernel/random/boot_id"


@lru_cache(maxsize=1)
def host_key() -> str | None:
    """``boot id/pid namespace`` of this process, or None where they cannot be read."""
    try:
        with open(_BOOT_ID, encoding="ascii") as f:
            boot = f.read().strip()
        namespace = os.readlink("/proc/self/ns/pid")  # e.g. "pid:[4026531836]"
    except OSError:
        return None
    if not boot or not namespace:
        return None
    return f"{boot}/{namespace}"


def pid_gone(pid: int) -> bool:
    """Is process ``pid`` gone from this pid namespace? True when no such process exists or
    it has ended and waits to be reaped (a zombie runs nothing). A pid that exists, even one
    reused by another program, is not gone: that worker is left to its leases."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # it exists, owned by someone else
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except FileNotFoundError:
        return True  # ended between the two looks
    except OSError:
        return False
    # "pid (comm) S ...": the state follows the last ')' (comm may hold spaces and parens)
    state = stat[stat.rfind(")") + 2:stat.rfind(")") + 3]
    return state in ("Z", "X")
