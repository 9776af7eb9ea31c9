"""docs/generations.md's examples run: its Python blocks, loaded as one module the way a
reader would paste them, against a real API (tokens required) and a real worker on each
backend. The monitor reconciler starts one monitor per key of repositories.txt; the
cleanup supervisor's reconciler starts a supervisor per key of jobs.txt, and when the key
goes, cancels its runner child, after which the supervisor releases its lease."""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests._helpers import store_fixture, until, wait_status
from tests.generations._api import Running, served
from veracity.core.states import Status
from veracity.models import Execution, ExecutionFilter
from veracity.store import Store

pytestmark = pytest.mark.timeout(60)

store = store_fixture(pool_size=4)
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "generations.md"


@pytest.fixture
def guide(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    code = "\n\n".join(re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S))
    path = tmp_path / "generations_guide.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location("generations_guide", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["generations_guide"] = module
    spec.loader.exec_module(module)
    monkeypatch.chdir(tmp_path)  # its keys files are read from the working folder
    try:
        yield module
    finally:
        sys.modules.pop("generations_guide", None)


async def test_the_monitors_reconciler(guide: ModuleType, store: Store, tmp_path: Path
                                       ) -> None:
    (tmp_path / "repositories.txt").write_text("veracity\nobelisk\n")
    async with served(store, tmp_path, guide.app, reconciler="monitors:control/reconciler.run",
                      prefix="monitors:repo/monitor.run") as r:
        assert (await r.reconcile()).result == "kept 0; started 2"
        monitors = await blocked(r, 2)
        assert sorted(m.params for m in monitors) == [["obelisk"], ["veracity"]]
        (tmp_path / "repositories.txt").write_text("veracity\n")
        assert (await r.reconcile()).result == "kept 1; started 0"
        [gone] = [m for m in monitors if m.params == ["obelisk"]]
        await wait_status(store, gone.id, Status.CANCELLED)


async def blocked(r: Running, n: int) -> list[Execution]:
    """Once ``n`` listed executions are blocked: them."""
    async def check() -> list[Execution] | None:
        got = await r.managed(Status.BLOCKED)
        return got if len(got) == n else None

    found: list[Execution] = await until(check, what=f"{n} blocked")
    return found


async def test_the_cleanup_supervisor(guide: ModuleType, store: Store, tmp_path: Path
                                      ) -> None:
    (tmp_path / "jobs.txt").write_text("nightly\n")
    async with served(store, tmp_path, guide.app,
                      reconciler="monitors:control/jobs-reconciler.run",
                      prefix="monitors:jobs/runner.run") as r:
        assert (await r.reconcile()).result == "kept 0; started 1"
        [sup] = await store.execution_list(
            ExecutionFilter(ffqn_prefix="monitors:jobs/supervisor.run"), limit=10)
        [child] = await blocked(r, 1)
        assert (child.parent_id, child.params) == (sup.id, ["nightly", "lease-nightly"])
        assert (await r.reconcile()).result == "kept 1; started 0"  # nothing replaced

        (tmp_path / "jobs.txt").write_text("")
        assert (await r.reconcile()).result == "kept 0; started 0"
        await wait_status(store, child.id, Status.CANCELLED)
        done = await wait_status(store, sup.id, Status.COMPLETED, Status.FAILED)
        assert (done.status, done.result) == (Status.COMPLETED,
                                              "cancelled; released lease-nightly")
        # the supervisor was never a candidate: never cancelled, never paused
        assert not [p for _, p in r.seen if str(sup.id) in p]
