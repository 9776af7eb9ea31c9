"""``veracity submit --from-file``, ``submit --wait``, ``get --follow`` and the check of
params at submit, as real processes on both backends."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from datetime import timedelta
from pathlib import Path

from tests._helpers import store_fixture
from tests.cli.test_cli import MAIL, ORDERS, VERACITY, base_env, ok, ok_json, run
from veracity.models import Claim, ExecutionFilter
from veracity.store import Store

TTL = timedelta(seconds=60)
store = store_fixture()


async def _count(store: Store) -> int:
    return len(await store.execution_list(ExecutionFilter(), limit=10_000))


def _write(path: Path, lines: list[object]) -> Path:
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines)
                    + "\n", encoding="utf-8")
    return path


async def test_submit_from_file_in_order_with_idempotency_keys(
    database_url: str, tmp_path: Path, store: Store
) -> None:
    env = base_env(database_url)
    jobs = _write(tmp_path / "jobs.jsonl", [
        {"ffqn": ORDERS, "params": ["o-1", 5], "idempotency_key": "a"},
        "",
        {"ffqn": MAIL, "params": ["x@example.com", "hi"]},
        {"ffqn": ORDERS, "params": ["o-1", 5], "idempotency_key": "a"},
    ])
    body = ok_json(run(["submit", "--from-file", str(jobs), "--json"], env, tmp_path))
    assert body["created"] == [True, True, False]
    ids = [e["id"] for e in body["items"]]
    assert ids[0] == ids[2]
    assert [e["ffqn"] for e in body["items"]] == [ORDERS, MAIL, ORDERS]
    out = ok(run(["submit", "--from-file", str(jobs)], env, tmp_path))
    lines = out.splitlines()
    assert lines[0] == lines[2] == f"{ids[0]}  already submitted"
    assert lines[1].endswith("  submitted") and not lines[1].startswith(ids[1])
    assert lines[3] == "1 submitted, 2 already submitted (same idempotency key)"
    assert await _count(store) == 3  # the second run's line 3 had no key: a new one


async def test_submit_from_file_refuses_a_file_with_bad_lines_whole(
    database_url: str, tmp_path: Path, store: Store
) -> None:
    env = base_env(database_url)
    jobs = _write(tmp_path / "bad.jsonl", [
        {"ffqn": ORDERS, "params": ["o-1", 5]},
        {"ffqn": ORDERS, "params": []},
        "{not json",
        {"ffqn": "shop:nothing/here.run"},
        {"ffqn": ORDERS, "params": ["o-2"]},
    ])
    result = run(["submit", "--from-file", str(jobs)], env, tmp_path)
    assert result.returncode == 1, result
    assert result.stderr.startswith("error: 3 bad line(s)"), result.stderr
    assert "nothing was submitted" in result.stderr
    assert f"{jobs}:2: params do not fit workflow {ORDERS}" in result.stderr
    assert f"{jobs}:3: " in result.stderr and f"{jobs}:4: unknown workflow" in result.stderr
    assert f"{jobs}:5" not in result.stderr and f"{jobs}:1" not in result.stderr
    assert await _count(store) == 0
    missing = run(["submit", "--from-file", str(tmp_path / "none.jsonl")], env, tmp_path)
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    both = run(["submit", ORDERS, "--from-file", str(jobs)], env, tmp_path)
    assert both.returncode == 2 and "--from-file" in both.stderr
    assert await _count(store) == 0


async def test_submit_refuses_params_that_do_not_fit(
    database_url: str, tmp_path: Path, store: Store
) -> None:
    result = run(["submit", MAIL, '"only-to"'], base_env(database_url), tmp_path)
    assert result.returncode == 1
    assert "missing subject" in result.stderr and result.stderr.startswith("error: params")
    assert await _count(store) == 0


async def _end_when_submitted(store: Store, ffqn: str, *, fail: bool = False) -> uuid.UUID:
    """Claim the execution of ``ffqn`` once it exists, then complete (or fail) it."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        claimed = await store.execution_claim("w", [ffqn], limit=1, lease_ttl=TTL)
        if claimed:
            claim = Claim(claimed[0].id, "w", claimed[0].lease_epoch)
            await asyncio.sleep(0.5)  # the command waits by now
            if fail:
                assert (await store.execution_fail_if_owned(claim, {"why": "no"})).applied
            else:
                assert (await store.execution_complete_if_owned(
                    claim, {"sent": True})).applied
            return claim.execution_id
        await asyncio.sleep(0.05)
    raise AssertionError("the command submitted nothing")


async def test_submit_wait_prints_the_result_once_it_ends(
    database_url: str, tmp_path: Path, store: Store
) -> None:
    proc = subprocess.Popen([VERACITY, "submit", MAIL, '"to@example.com"', '"hi"', "--wait"],
                            env=base_env(database_url), cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        ident = await _end_when_submitted(store, MAIL)
        out, err = await asyncio.to_thread(proc.communicate, timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, (out, err)
    assert f"submitted: {ident}; waiting for it to end" in err
    assert "status           completed" in out and '{"sent": true}' in out


async def test_get_follow_waits_and_exits_1_for_a_failure(
    database_url: str, tmp_path: Path, store: Store
) -> None:
    env = base_env(database_url)
    submitted = ok_json(run(["submit", ORDERS, '"o-9"', "--json"], env, tmp_path))
    proc = subprocess.Popen([VERACITY, "get", submitted["id"], "--follow", "--json"],
                            env=env, cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        await _end_when_submitted(store, ORDERS, fail=True)
        out, err = await asyncio.to_thread(proc.communicate, timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 1, (out, err)
    assert json.loads(out)["status"] == "failed"
    assert err.startswith(f"error: execution {submitted['id']} ended failed")
    # an ended one answers at once
    again = run(["get", submitted["id"], "--follow"], env, tmp_path)
    assert again.returncode == 1 and "status           failed" in again.stdout
    # one that ended without an error (cancelled) is said so, with no empty error after it
    other = ok_json(run(["submit", "shop:monitor/stock.run-cancellable", '"sku-1"', "--json"],
                        env, tmp_path))
    assert run(["cancel", other["id"]], env, tmp_path).returncode == 0
    cancelled = run(["get", other["id"], "--follow"], env, tmp_path)
    assert cancelled.returncode == 1
    assert cancelled.stderr == f"error: execution {other['id']} ended cancelled\n"
    # a refusal names what was refused and to which execution; its hint is a command
    for argv, said in [
        (["pause", other["id"]], f"error: cannot pause {other['id']}: execution is cancelled"),
        (["send", other["id"], "go", "1"],
         f"error: cannot send to {other['id']}: execution is cancelled"),
    ]:
        refused = run(argv, env, tmp_path)
        assert refused.returncode == 1 and refused.stderr == said + "\n", refused
    pending = ok_json(run(["submit", ORDERS, '"o-11"', "11", "--json"], env, tmp_path))
    refused = run(["cancel", pending["id"]], env, tmp_path)
    assert refused.returncode == 1
    assert refused.stderr.startswith(
        f"error: cannot cancel {pending['id']}: {ORDERS} cannot be cancelled"), refused
    assert f"Pause it instead (veracity pause {pending['id']})" in refused.stderr
    assert "PUT /v1" not in refused.stderr


async def test_submit_from_file_of_more_than_a_thousand_lines(
    database_url: str, tmp_path: Path, store: Store
) -> None:
    """1,000 lines per transaction: a key of the first thousand repeated in the third is
    answered its execution, in order."""
    lines: list[object] = [{"ffqn": ORDERS, "params": [f"o-{i}", i], "idempotency_key": f"k{i}"}
                           for i in range(2100)]
    lines[2050] = {"ffqn": ORDERS, "params": ["o-5", 5], "idempotency_key": "k5"}
    jobs = _write(tmp_path / "many.jsonl", lines)
    body = ok_json(run(["submit", "--from-file", str(jobs), "--json"],
                       base_env(database_url), tmp_path))
    assert len(body["items"]) == 2100
    assert body["created"].count(False) == 1 and body["created"][2050] is False
    assert body["items"][2050]["id"] == body["items"][5]["id"]
    assert [e["params"][1] for e in body["items"][:3]] == [0, 1, 2]
    assert await _count(store) == 2099


async def test_submit_from_file_refused_in_its_first_thousand_names_the_line(
    database_url: str, tmp_path: Path, store: Store
) -> None:
    """A key used before with another request, on the file's second line: nothing is
    submitted, said once, and the line is named by its number in the file."""
    env = base_env(database_url)
    first = _write(tmp_path / "first.jsonl",
                   [{"ffqn": ORDERS, "params": ["o-1", 1], "idempotency_key": "k"}])
    assert run(["submit", "--from-file", str(first)], env, tmp_path).returncode == 0
    jobs = _write(tmp_path / "conflict.jsonl", [
        {"ffqn": ORDERS, "params": ["o-2", 2], "idempotency_key": "new"},
        {"ffqn": ORDERS, "params": ["other", 9], "idempotency_key": "k"},
    ])
    result = run(["submit", "--from-file", str(jobs)], env, tmp_path)
    assert result.returncode == 1, result
    assert result.stderr.splitlines()[0] == (
        "error: 1 idempotency key(s) used before for a different request; nothing was "
        "submitted"), result.stderr
    assert result.stderr.splitlines()[1].startswith(f"{jobs}:2: idempotency key 'k' names ")
    assert await _count(store) == 1


async def test_submit_from_file_refused_in_a_later_thousand_keeps_the_ones_before(
    database_url: str, tmp_path: Path, store: Store
) -> None:
    """A conflict found only when a later thousand is written (an idempotency key already
    stored with other params) refuses that thousand and those after it; the thousands
    before it stay submitted and the message says so. With a key on every line, running
    the file again once mended submits the rest and answers the others their executions."""
    env = base_env(database_url)
    stored = _write(tmp_path / "stored.jsonl",
                    [{"ffqn": ORDERS, "params": ["other", 0], "idempotency_key": "k1500"}])
    assert run(["submit", "--from-file", str(stored)], env, tmp_path).returncode == 0
    lines: list[object] = [{"ffqn": ORDERS, "params": [f"o-{i}", i], "idempotency_key": f"k{i}"}
                           for i in range(2100)]
    jobs = _write(tmp_path / "conflict.jsonl", lines)
    result = run(["submit", "--from-file", str(jobs)], env, tmp_path)
    assert result.returncode == 1, result
    assert result.stderr.splitlines()[0] == (
        "error: 1 idempotency key(s) used before for a different request; nothing from "
        "line 1001 on was submitted; the 1,000 line(s) before it were"), result.stderr
    assert f"{jobs}:1501: idempotency key 'k1500' names execution " in result.stderr
    assert len(result.stderr.splitlines()) == 2, result.stderr
    assert await _count(store) == 1001
    lines[1500] = {"ffqn": ORDERS, "params": ["o-1500", 1500], "idempotency_key": "k1500b"}
    body = ok_json(run(["submit", "--from-file", str(_write(jobs, lines)), "--json"],
                       env, tmp_path))
    assert body["created"] == [False] * 1000 + [True] * 1100
    assert await _count(store) == 2101


async def test_submit_from_file_with_a_key_given_twice_for_different_requests_writes_none(
    database_url: str, tmp_path: Path, store: Store
) -> None:
    """The file itself gives one key to two different requests, a thousand lines apart:
    found when the whole file is checked, before anything is written; both lines named.
    The same key for the same request twice is no conflict (the later line answers the
    first one's execution)."""
    env = base_env(database_url)
    lines: list[object] = [{"ffqn": ORDERS, "params": [f"o-{i}", i], "idempotency_key": f"k{i}"}
                           for i in range(2100)]
    lines[1500] = {"ffqn": ORDERS, "params": ["other", 0], "idempotency_key": "k5"}
    jobs = _write(tmp_path / "twice.jsonl", lines)
    result = run(["submit", "--from-file", str(jobs)], env, tmp_path)
    assert result.returncode == 1, result
    assert result.stderr.splitlines() == [
        f"error: 1 idempotency key(s) given twice in {jobs} for different requests; nothing "
        "was submitted",
        f"{jobs}:1501: idempotency key 'k5' is line 6's, given here for a different request",
    ], result.stderr
    assert await _count(store) == 0
    lines[1500] = lines[5]
    body = ok_json(run(["submit", "--from-file", str(_write(jobs, lines)), "--json"],
                       env, tmp_path))
    assert body["created"].count(False) == 1 and body["created"][1500] is False
    assert body["items"][1500]["id"] == body["items"][5]["id"]
    assert await _count(store) == 2099


async def test_ctrl_c_during_a_wait_names_the_execution_waited_on(
    database_url: str, tmp_path: Path, store: Store
) -> None:
    """SIGINT while `submit --wait` or `get --follow` waits: one `error:` line naming the
    execution (submitted, and going on), exit 1; not click's bare "Aborted!"."""
    import signal

    env = base_env(database_url)

    async def interrupted(argv: list[str], said: str) -> tuple[int | None, str]:
        # SIGINT as a terminal leaves it (a test run started in the background inherits
        # it ignored, and Python keeps an ignored SIGINT ignored)
        proc = subprocess.Popen([VERACITY, *argv], env=env, cwd=tmp_path, text=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                 signal.SIG_DFL))
        try:
            assert proc.stderr is not None
            line = await asyncio.wait_for(asyncio.to_thread(proc.stderr.readline), 30)
            assert said in line, line
            proc.send_signal(signal.SIGINT)
            _, err = await asyncio.to_thread(proc.communicate, timeout=30)
        finally:
            proc.kill()
        return proc.returncode, line + err

    code, err = await interrupted(["submit", ORDERS, '"o-1"', "1", "--paused", "--wait"],
                                  "waiting for it to end")
    (held,) = await store.execution_list(ExecutionFilter(), limit=10)
    assert code == 1, err
    assert err.splitlines()[-1] == (
        f"error: interrupted while waiting for execution {held.id}; it goes on "
        f"(`veracity get {held.id} --follow` waits again)"), err
    assert str(held.status) == "paused"  # submitted, and left as it was
    code, err = await interrupted(["get", str(held.id), "--follow"],
                                  f"waiting for {held.id} to end")
    assert code == 1, err
    assert err.splitlines()[-1].startswith(
        f"error: interrupted while waiting for execution {held.id}; it goes on"), err
    assert "Aborted!" not in err and "Traceback" not in err
