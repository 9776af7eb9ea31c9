"""SIGUSR1 makes a running ``veracity worker`` log what each of its tasks waits on, in one
``tasks`` line (docs/workers.md, "A worker that does not stop"), and changes nothing else:
the worker goes on and stops cleanly after."""

from __future__ import annotations

import signal

import pytest

from tests.worker._procs import Processes, wait_until


@pytest.mark.timeout(60)
async def test_sigusr1_logs_each_task_and_the_worker_goes_on(
    pg_url: str, procs: Processes
) -> None:
    w = procs.worker(pg_url, "A")
    await w.registered()
    w.signal(signal.SIGUSR1)

    def dumped() -> dict[str, str] | None:
        for record in w.log_records():
            if record.get("message") == "tasks":
                tasks: dict[str, str] = record["tasks"]
                return tasks
        return None

    tasks = await wait_until(dumped, 10, what="the tasks line", describe=w.describe)
    assert tasks is not None
    assert "veracity-heartbeat" in tasks and "veracity-recovery" in tasks, tasks
    # the main task's chain of awaits, down to where the claim loop waits
    assert any("in _claim_loop" in where and "in run_worker" in where
               for where in tasks.values()), tasks
    assert "in _heartbeat_loop" in tasks["veracity-heartbeat"], tasks
    assert w.alive, w.describe()
    w.terminate()
    assert await w.wait(10) == 0, w.describe()


@pytest.mark.timeout(60)
async def test_a_worker_that_outlives_a_wait_shows_its_tasks_in_the_failure(
    pg_url: str, procs: Processes
) -> None:
    """The harness asks a worker that did not exit in time for its tasks, so a stuck
    shutdown's failure says where it was stuck."""
    w = procs.worker(pg_url, "A")
    await w.registered()
    with pytest.raises(AssertionError, match=r"still running after 0\.2s") as info:
        await w.wait(0.2)  # never asked to stop: still running
    assert '"message": "tasks"' in str(info.value) and "_claim_loop" in str(info.value)
    w.terminate()
    assert await w.wait(10) == 0, w.describe()
