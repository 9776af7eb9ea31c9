"""veracity.host: the host key a worker registers and whether a pid is gone (docs/workers.md,
"A worker whose process is gone"), against real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from veracity.host import host_key, pid_gone


def test_the_host_key_is_this_boot_and_pid_namespace() -> None:
    key = host_key()
    assert key is not None  # the tests run on Linux
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
        boot = f.read().strip()
    assert key == f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    # a child process in the same namespace has the same key
    child = subprocess.run(
        [sys.executable, "-c", "from veracity.host import host_key; print(host_key())"],
        capture_output=True, text=True, check=True, timeout=30)
    assert child.stdout.strip() == key


def test_a_running_process_is_not_gone() -> None:
    assert not pid_gone(os.getpid())
    assert not pid_gone(1)  # exists (another program, perhaps another user): not gone
    with subprocess.Popen(["sleep", "30"]) as child:
        try:
            assert not pid_gone(child.pid)
            child.send_signal(signal.SIGSTOP)  # frozen, not gone: its leases decide
            assert not pid_gone(child.pid)
        finally:
            child.kill()
            child.wait()


def test_a_killed_process_is_gone_before_and_after_it_is_reaped() -> None:
    child = subprocess.Popen(["sleep", "30"])
    os.kill(child.pid, signal.SIGKILL)
    # not reaped yet: a zombie, which runs nothing
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    assert pid_gone(child.pid)
    child.wait()
    assert pid_gone(child.pid)


def test_pids_that_cannot_be_a_worker_are_not_gone() -> None:
    assert not pid_gone(0)
    assert not pid_gone(-1)
