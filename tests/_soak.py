"""The soak of tests/test_soak.py, run in the background of an xdist run.

The soak is two minutes of a subprocess (bench.soak) that pytest only waits for. Under
pytest-xdist the controller starts it as soon as a worker reports the soak test collected
(tests/conftest.py), in the run's base folder, so that no worker is held for those two
minutes; the test, run last, reads what it wrote (its report, its output, its exit code). Run
without xdist, or where the controller did not start it, the test runs it itself."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SEED = 2024
MINUTES = 2
TEST_ID = "tests/test_soak.py::test_a_two_minute_soak_breaks_no_guarantee"
FOLDER = "soak-background"
"""The folder, in the run's base folder, of the soak the controller started."""


def command(folder: Path) -> list[str]:
    return [sys.executable, "-m", "bench.soak", "--seed", str(SEED), "--minutes", str(MINUTES),
            "--workers", "2", "--workdir", str(folder / "soak"),
            "--json", str(folder / "soak.json")]


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str


class Background:
    """The soak as a process of the controller's, writing its output and, when it exits, its
    exit code (``returncode``) into *folder*."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True)
        self.folder = folder
        with (folder / "stdout").open("w") as out, (folder / "stderr").open("w") as err:
            self.proc = subprocess.Popen(command(folder), cwd=REPO_ROOT, stdout=out,
                                         stderr=err, stdin=subprocess.DEVNULL)
        self._waiter = threading.Thread(target=self._wait, name="veracity-soak", daemon=True)
        self._waiter.start()

    def _wait(self) -> None:
        code = self.proc.wait()
        partial = self.folder / "returncode.partial"
        partial.write_text(str(code))
        partial.rename(self.folder / "returncode")  # whole or absent, never half written

    def stop(self) -> None:
        """End it (as on Ctrl-C: it stops its processes and its cluster) if still running."""
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=60)
        self._waiter.join(timeout=5)


def finished(folder: Path) -> Finished | None:
    """What the soak in *folder* left, once it has exited; ``None`` before."""
    code = folder / "returncode"
    if not code.exists():
        return None
    return Finished(int(code.read_text()), (folder / "stdout").read_text(errors="replace"),
                    (folder / "stderr").read_text(errors="replace"))


def run_here(folder: Path, timeout: float) -> Finished:
    """Run the soak in this process and wait for it."""
    folder.mkdir(parents=True, exist_ok=True)
    soak = subprocess.Popen(command(folder), cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = soak.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        soak.terminate()  # it stops its processes and its cluster, as on Ctrl-C
        stdout, stderr = soak.communicate(timeout=60)
        raise AssertionError(f"the soak did not end within {timeout:g} s:\n{stdout[-6000:]}\n"
                             f"{stderr[-4000:]}") from None
    return Finished(soak.returncode, stdout, stderr)
