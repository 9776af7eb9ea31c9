"""Commands: server, worker, workers, crons, deployments, migrate, submit, get, list, history,
replay, retry, cancel, pause, unpause, send, resolve, prune, token.

Exit codes (README.md, "CLI"): 0 success; 1 an error found while the command ran (bad
input, not found, a refused action, database unreachable: one ``error:`` line); 2 a command
line click could not parse (its ``Usage:`` message).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import click

from veracity.cli.output import (
    fields_lines,
    fmt_time,
    print_fields,
    print_json,
    print_table,
    short,
)
from veracity.config import MAX_RETENTION, Settings, load_settings, parse_duration
from veracity.core.states import Status
from veracity.errors import ConfigError, Conflict, InvalidInput, VeracityError
from veracity.models import ApiToken, Execution, ExecutionFilter, HistoryEvent, Message

if TYPE_CHECKING:
    from pydantic import ValidationError

    from veracity.api.schemas import (
        AdoptOut,
        CronOut,
        DeploymentOut,
        ExecutionOut,
        HistoryItem,
        SubmitRequest,
        WorkerOut,
    )
    from veracity.control import (
        MAX_BATCH,
        MAX_HISTORY_LIMIT,
        MAX_WAIT,
        AdoptOutcome,
        CreatedToken,
        DeploymentView,
        ExecutionService,
        InvalidBatch,
        Resolved,
        SubmitItem,
        TokenService,
        TokenView,
    )
    from veracity.runtime import Runtime, open_runtime, redact_url
    from veracity.store import open_store
    from veracity.worker.replayer import ReplayResult, replay_async

# What the commands use, loaded when one runs (_load), not to print --help, and not for
# `veracity worker`, which loads what it needs itself and starts sooner without the rest.
_LAZY = {
    "pydantic": "ValidationError",
    "veracity.api.schemas": "AdoptOut CronOut DeploymentOut ExecutionOut HistoryItem "
                            "SubmitRequest WorkerOut",
    "veracity.control": "MAX_BATCH MAX_HISTORY_LIMIT MAX_WAIT AdoptOutcome CreatedToken "
                        "DeploymentView ExecutionService InvalidBatch Resolved SubmitItem "
                        "TokenService TokenView",
    "veracity.runtime": "Runtime open_runtime redact_url",
    "veracity.store": "open_store",
    "veracity.worker.replayer": "ReplayResult replay_async",
}


def _load() -> None:
    """Bind the commands' imports in this module (once)."""
    if "open_runtime" in globals():
        return
    from importlib import import_module

    for module, names in _LAZY.items():
        loaded = import_module(module)
        globals().update({name: getattr(loaded, name) for name in names.split()})


T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class Failure(click.ClickException):
    """An error: printed as ``error: message``, exit code 1."""

    exit_code = 1

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.message}", err=True)


def _unusable_database(exc: Exception) -> bool:
    """The database could not be used (unreachable, not migrated, a missing file)."""
    import sqlite3

    import psycopg
    import psycopg_pool

    return isinstance(exc, psycopg.OperationalError | psycopg_pool.PoolTimeout
                      | sqlite3.OperationalError | psycopg.errors.UndefinedTable
                      | FileNotFoundError)


def run(coro: Coroutine[Any, Any, T], *, fast_loop: bool = False) -> T:
    """Run a command's coroutine, turning known failures into one line and exit 1.
    ``fast_loop`` uses uvloop where it is installed (long-running processes)."""
    try:
        if fast_loop:
            try:
                import uvloop
            except ImportError:  # pragma: no cover - uvicorn[standard] brings it
                pass
            else:
                return uvloop.run(coro)
        return asyncio.run(coro)
    except VeracityError as exc:
        raise Failure(exc.message) from None
    except ConfigError as exc:
        raise Failure(str(exc)) from None
    except Exception as exc:
        if not _unusable_database(exc):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if type(exc).__name__ == "UndefinedTable" or "no such table" in first:
            first += " (run `veracity migrate`, or start the server once: it migrates)"
        raise Failure(f"cannot use the database: {first}") from None


def common_options(fn: F) -> F:
    """--config, --database-url and --app, on every command."""
    fn = click.option("--app", "app", default=None, metavar="MODULE:ATTR",
                      help="The App to load (VERACITY_APP).")(fn)
    fn = click.option("--database-url", "database_url", default=None, metavar="URL",
                      help="postgresql://... or sqlite:///path (VERACITY_DATABASE_URL).")(fn)
    fn = click.option("--config", "config_path", default=None, metavar="PATH",
                      type=click.Path(dir_okay=False),
                      help="Configuration file (VERACITY_CONFIG; default ./veracity.toml).")(fn)
    return fn


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(fn)


def settings_from(config_path: str | None, **overrides: Any) -> Settings:
    try:
        return load_settings(config_path, overrides=overrides)
    except ConfigError as exc:
        raise Failure(str(exc)) from None


async def with_runtime(settings: Settings, fn: Callable[[Runtime], Awaitable[T]], *,
                       engines: bool = False, read_only: bool = False) -> T:
    """``read_only``: a command that only reads needs neither the engines' secrets nor the
    [[cron]] entries' checks. No command run through here creates a database
    (``veracity migrate``, ``veracity server`` and ``veracity worker`` open their own):
    a missing SQLite file is an error, never created."""
    runtime = await open_runtime(settings, engines=engines, read_only=read_only,
                                 create=False)
    try:
        # through a pooler in transaction mode its prepared statements could run another
        # client's, and its locks and waits break: refused, as a server refuses to start
        # (docs/scaling.md, "Connection poolers")
        await runtime.store.check_session()
        return await fn(runtime)
    finally:
        await runtime.close()


def execution_json(e: Execution, waiting_reason: str | None = None) -> dict[str, Any]:
    _load()
    return ExecutionOut.of(e, waiting_reason).model_dump(mode="json")


def event_json(ev: HistoryEvent) -> dict[str, Any]:
    _load()
    return HistoryItem.of(ev).model_dump(mode="json")


def print_execution(e: Execution, waiting_reason: str | None = None, *,
                    whole: bool = False) -> None:
    """``whole``: the result and error in full (not shortened)."""
    width = 1 << 62 if whole else 200
    print_fields([
        ("id", str(e.id)),
        ("ffqn", e.ffqn),
        ("status", str(e.status)),
        ("waiting", waiting_reason or "-"),
        ("params", short(e.params, 200)),
        ("result", short(e.result, width) if e.status == Status.COMPLETED else "-"),
        ("error", short(e.error, width) if e.error is not None else "-"),
        ("attempt", str(e.attempt)),
        ("deployment", e.deployment_id),
        ("parent", str(e.parent_id) if e.parent_id else "-"),
        ("idempotency key", e.idempotency_key or "-"),
        ("scheduled at", fmt_time(e.scheduled_at)),
        ("created at", fmt_time(e.created_at)),
        ("updated at", fmt_time(e.updated_at)),
        ("lease", f"{e.lease_owner} epoch {e.lease_epoch} until {fmt_time(e.lease_expires_at)}"
                  if e.lease_owner else "-"),
    ])


def parse_time(name: str, value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an ISO 8601 time with its offset, e.g. "
                                 "2030-01-01T00:00:00Z", param_hint=name) from None
    if parsed.tzinfo is None:
        raise click.BadParameter("give a timezone, e.g. 2030-01-01T00:00:00Z", param_hint=name)
    return parsed


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="veracity")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Veracity: durable workflow executions that never lie about their state."""
    if ctx.invoked_subcommand != "worker":
        _load()


@cli.command()
@common_options
@click.option("--host", default=None, help="Address to listen on (VERACITY_HOST).")
@click.option("--port", default=None, type=int, help="Port to listen on (VERACITY_PORT).")
@click.option("--worker/--no-worker", "with_worker", default=None,
              help="Run a worker in this process (default: on with SQLite, off with "
                   "PostgreSQL).")
@click.option("--insecure", is_flag=True,
              help="Serve a non-loopback address with auth.required = false (only when "
                   "something in front authenticates every request).")
def server(config_path: str | None, database_url: str | None, app: str | None,
           host: str | None, port: int | None, with_worker: bool | None,
           insecure: bool) -> None:
    """Run the HTTP API and the background services (migrates the database first)."""
    from veracity._logging import setup_logging
    from veracity.server import check_bind, run_server

    settings = settings_from(config_path, database_url=database_url, app=app, host=host,
                             port=port)
    setup_logging(settings.log_level)
    try:
        check_bind(settings, insecure=insecure)  # before anything binds the port
        from veracity.adapters.config import parse_external
        from veracity.bindings import resolve_http
        from veracity.runtime import cron_entries, load_user_app

        user_app = load_user_app(settings)  # fail fast, before binding the port
        external = parse_external(settings)  # a misconfigured engine is named at start
        cron_entries(settings, user_app, external)  # and so is a bad [[cron]] entry
        resolve_http(settings)  # and a binding whose secret is not defined
        if settings.database_url.startswith(("postgresql://", "postgres://")):
            asyncio.run(_sessions_kept(settings.database_url))  # and a pooler that breaks them
    except ConfigError as exc:
        raise Failure(str(exc)) from None
    sys.exit(run_server(settings, with_worker=with_worker))


async def _sessions_kept(url: str) -> None:
    """The server's check, before it binds its port, that its database answers and that its
    connections keep their sessions (Store.check_session, docs/scaling.md, "Connection
    poolers"), so that it fails in one line (its start checks again)."""
    from veracity.store import open_store

    try:
        store = await open_store(url, pool_size=1)
    except Exception as exc:
        said = str(exc).strip()
        first = said.splitlines()[0] if said else type(exc).__name__
        raise ConfigError(f"the database at {redact_url(url)} does not answer: {first}"
                          ) from None
    try:
        await store.check_session()
    except ConfigError:
        raise
    except Exception:
        return
    finally:
        await store.close()


@cli.command()
@common_options
@click.option("--concurrency", default=None, type=click.IntRange(1, 10000),
              help="Executions run at once (VERACITY_WORKER_CONCURRENCY).")
@click.option("--metrics-port", default=None, type=click.IntRange(1, 65535),
              help="Serve Prometheus metrics on this port (VERACITY_WORKER_METRICS_PORT).")
def worker(config_path: str | None, database_url: str | None, app: str | None,
           concurrency: int | None, metrics_port: int | None) -> None:
    """Run a worker: claim and run executions of the app's workflows until SIGTERM/SIGINT."""
    from veracity._logging import setup_logging
    from veracity.worker.main import run_worker

    settings = settings_from(config_path, database_url=database_url, app=app,
                             **{"worker.concurrency": concurrency,
                                "worker.metrics_port": metrics_port})
    setup_logging(settings.log_level)
    sys.exit(run(run_worker(settings), fast_loop=True))


@cli.command()
@common_options
@json_option
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 1000))
def workers(config_path: str | None, database_url: str | None, app: str | None, as_json: bool,
            limit: int) -> None:
    """List registered workers, newest first."""
    settings = settings_from(config_path, database_url=database_url, app=app)
    views = run(with_runtime(settings, lambda rt: rt.service.workers(limit=limit),
                             read_only=True))
    if as_json:
        print_json({"items": [WorkerOut.of(v).model_dump(mode="json") for v in views],
                    "next_cursor": None})
        return
    print_table(
        ["id", "live", "host", "pid", "deployment", "concurrency", "started at",
         "last heartbeat", "stopped at", "workflows"],
        [[v.record.id, "yes" if v.live else "no", v.record.host, str(v.record.pid),
          v.record.deployment_id, str(v.record.concurrency), fmt_time(v.record.started_at),
          fmt_time(v.record.last_heartbeat), fmt_time(v.record.stopped_at),
          short(", ".join(v.record.ffqns), 60)] for v in views],
    )


@cli.group(invoke_without_command=True)
@common_options
@json_option
@click.pass_context
def deployments(ctx: click.Context, config_path: str | None, database_url: str | None,
                app: str | None, as_json: bool) -> None:
    """List deployments, newest first: first and last seen, live workers, unfinished
    executions by status, and stranded ones (docs/deployments.md)."""
    if ctx.invoked_subcommand is not None:
        return
    settings = settings_from(config_path, database_url=database_url, app=app)
    views: list[DeploymentView] = run(with_runtime(settings, lambda rt: rt.service.deployments()))
    if as_json:
        print_json({"items": [DeploymentOut.of(v).model_dump(mode="json") for v in views],
                    "next_cursor": None})
        return
    print_table(
        ["id", "current", "first seen", "last seen", "live workers", "pending", "running",
         "blocked", "paused", "stranded"],
        [[v.summary.id, "*" if v.current else "", fmt_time(v.summary.first_seen),
          fmt_time(v.summary.last_seen), str(v.summary.live_workers),
          *(str(v.summary.unfinished[s]) for s in ("pending", "running", "blocked", "paused")),
          str(v.summary.stranded)] for v in views],
    )


@deployments.command()
@common_options
@json_option
@click.argument("old")
@click.option("--ffqn-prefix", default=None, metavar="P",
              help="Only executions whose workflow name starts with P.")
@click.option("--by", default=None, help="Who adopts them (default: $USER).")
def adopt(config_path: str | None, database_url: str | None, app: str | None,
          as_json: bool, old: str, ffqn_prefix: str | None, by: str | None) -> None:
    """Move the unfinished executions of deployment OLD onto the current deployment (this
    process's: deployment_id, or the digest of its app's code). Check first that their
    histories replay on the new code (docs/deployments.md)."""
    settings = settings_from(config_path, database_url=database_url, app=app)
    actor = by or os.environ.get("USER") or "cli"

    async def go(rt: Runtime) -> AdoptOutcome:
        return await rt.service.adopt(old, ffqn_prefix=ffqn_prefix, actor=actor)

    outcome = run(with_runtime(settings, go))
    if as_json:
        print_json(AdoptOut.of(outcome).model_dump(mode="json", by_alias=True))
        return
    n = len(outcome.execution_ids)
    click.echo(f"adopted {n} execution{'' if n == 1 else 's'} of {outcome.from_id} onto "
               f"{outcome.to_id}")
    for ident in outcome.execution_ids:
        click.echo(str(ident))


@cli.command()
@common_options
@json_option
def crons(config_path: str | None, database_url: str | None, app: str | None,
          as_json: bool) -> None:
    """List the [[cron]] entries: last slot, its execution and status, next slot."""
    settings = settings_from(config_path, database_url=database_url, app=app)
    views = run(with_runtime(settings, lambda rt: rt.service.crons()))
    items = [CronOut.of(v) for v in views]
    if as_json:
        print_json({"items": [item.model_dump(mode="json") for item in items]})
        return
    if not items:
        click.echo("no [[cron]] entries are configured")
        return
    print_table(
        ["name", "workflow", "schedule", "timezone", "last slot", "execution", "status",
         "next slot", "next slot (local)"],
        [[c.name, short(c.ffqn, 50), c.schedule, c.timezone, fmt_time(c.last_slot),
          c.last_execution_id or "-",
          str(c.last_execution_status) if c.last_execution_status else "-",
          fmt_time(c.next_slot),
          c.next_slot_local.strftime("%Y-%m-%d %H:%M:%S %z") if c.next_slot_local else "-"]
         for c in items],
    )


@cli.command()
@common_options
@json_option
def migrate(config_path: str | None, database_url: str | None, app: str | None,
            as_json: bool) -> None:
    """Apply the database migrations (safe to run from several processes at once)."""
    settings = settings_from(config_path, database_url=database_url, app=app)

    async def go() -> list[int]:
        store = await open_store(settings.database_url)
        try:
            return await store.migrate()
        finally:
            await store.close()

    applied = run(go())
    if as_json:
        print_json({"database": redact_url(settings.database_url), "applied": applied})
    elif applied:
        click.echo(f"applied migrations {', '.join(map(str, applied))} to "
                   f"{redact_url(settings.database_url)}")
    else:
        click.echo(f"{redact_url(settings.database_url)} is up to date")


@cli.command()
@common_options
@click.option("--older-than", "older_than", default=None, metavar="DURATION",
              help="Delete executions that ended longer ago than this (e.g. 7d, 12h); "
                   "default: retention.terminal.")
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@json_option
def prune(config_path: str | None, database_url: str | None, app: str | None,
          older_than: str | None, dry_run: bool, as_json: bool) -> None:
    """Delete terminal executions that ended long ago, with their history and messages,
    as retention does (docs/operations.md, Retention): never an unfinished one, nor a
    child before its parent."""
    settings = settings_from(config_path, database_url=database_url, app=app)
    if older_than is None:
        seconds = settings.retention.terminal
        if seconds <= 0:
            raise Failure("retention is off (retention.terminal = 0 keeps everything): "
                          "give --older-than")
    else:
        try:
            seconds = parse_duration(older_than)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--older-than") from None
        if seconds <= 0:
            raise click.BadParameter(
                f"{older_than!r}: must be above 0 (e.g. 7d)", param_hint="--older-than")
        if seconds > MAX_RETENTION:
            raise click.BadParameter(
                f"{older_than!r}: at most 36500d (100 years)", param_hint="--older-than")
    show_bar = sys.stderr.isatty() and not as_json
    from veracity.maintenance.retention import RetentionResult, RetentionService

    async def go() -> RetentionResult:
        store = await open_store(settings.database_url, create=False)
        try:
            await store.check_session()  # its single-runner lock needs a kept session
            service = RetentionService(store, older_than=seconds)
            cutoff = await service.cutoff()
            if not show_bar:
                return await service.run_once(dry_run=dry_run, cutoff=cutoff)
            total = await store.execution_prune_count(cutoff=cutoff)
            label = "counting" if dry_run else "pruning"
            with click.progressbar(length=total, label=label, file=sys.stderr) as bar:
                return await service.run_once(
                    dry_run=dry_run, cutoff=cutoff,
                    on_batch=lambda b: bar.update(b.roots))
        finally:
            await store.close()

    result = run(go())
    if not result.ran:
        raise Failure("another process is running retention now; try again when it ends")
    assert result.cutoff is not None
    if as_json:
        print_json({"dry_run": dry_run, "cutoff": result.cutoff.isoformat(),
                    "executions": result.executions, "history": result.history,
                    "messages": result.messages, "kept": result.kept})
        return
    verb = "would delete" if dry_run else "deleted"
    line = (f"{verb} {result.executions} execution{'' if result.executions == 1 else 's'}"
            f" that ended before {fmt_time(result.cutoff)}"
            f" ({result.history} history events, {result.messages} messages)")
    click.echo(line)
    if result.kept:
        click.echo("kept: " + ", ".join(f"{n} {reason}" for reason, n in
                                        sorted(result.kept.items())))


def _parse_params(params_json: str | None, values: tuple[str, ...]) -> list[Any]:
    if params_json is not None and values:
        raise click.UsageError("give parameters either as arguments or with --params, not both")
    if params_json is not None:
        try:
            parsed = json.loads(params_json)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--params") from None
        if not isinstance(parsed, list):
            raise click.BadParameter("must be a JSON array", param_hint="--params")
        return parsed
    out: list[Any] = []
    for i, value in enumerate(values, 1):
        try:
            out.append(json.loads(value))
        except json.JSONDecodeError:
            raise click.BadParameter(
                f"{value!r} is not JSON (quote strings: '\"text\"')",
                param_hint=f"parameter {i}") from None
    return out


def _submissions_from(path: str) -> tuple[list[SubmitItem], dict[int, VeracityError],
                                          list[int]]:
    """The submissions of a JSON Lines file: one object per line as the body of POST
    /v1/executions; blank lines are skipped. Returns the items, those already found bad
    (by index), and each item's line number."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"cannot read {path}: {exc}", param_hint="--from-file") \
            from None
    items: list[SubmitItem] = []
    refused: dict[int, VeracityError] = {}
    numbers: list[int] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        numbers.append(number)
        try:
            one = SubmitRequest.model_validate_json(line)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first["loc"])
            refused[len(items)] = InvalidInput(
                f"{where + ': ' if where else ''}{first['msg']}", code="invalid_input")
            items.append(SubmitItem(""))
            continue
        items.append(SubmitItem(one.ffqn, one.params, one.idempotency_key, one.scheduled_at,
                                one.paused))
    return items, refused, numbers


async def _submit_file(rt: Runtime, path: str, items: list[SubmitItem],
                       refused: dict[int, VeracityError], numbers: list[int]
                       ) -> list[tuple[Execution, bool]]:
    """Check the whole file, then submit it MAX_BATCH lines per transaction."""
    try:
        news = rt.service.prepare_many(items, refused)
    except InvalidBatch as exc:
        bad = exc.details["items"]
        lines = [f"{path}:{numbers[b['index']]}: {b['message']}" for b in bad[:20]]
        more = f"\n... and {len(bad) - 20} more" if len(bad) > 20 else ""
        raise Failure(f"{len(bad)} bad line(s) in {path}; nothing was submitted\n"
                      + "\n".join(lines) + more) from None
    try:  # the whole file: a key given twice for different requests, whichever thousand
        rt.service.check_repeated_keys(news)
    except Conflict as exc:
        bad = exc.details["items"]
        lines = [f"{path}:{numbers[b['index']]}: idempotency key "
                 f"{news[b['index']].idempotency_key!r} is line "
                 f"{numbers[b['first_index']]}'s, given here for a different request"
                 for b in bad[:20]]
        more = f"\n... and {len(bad) - 20} more" if len(bad) > 20 else ""
        raise Failure(f"{len(bad)} idempotency key(s) given twice in {path} for different "
                      "requests; nothing was submitted\n" + "\n".join(lines) + more) from None
    done: list[tuple[Execution, bool]] = []
    for start in range(0, len(news), MAX_BATCH):
        try:
            done += await rt.service.submit_prepared(news[start:start + MAX_BATCH])
        except Conflict as exc:
            # the service's message counts items of this transaction from 0: say it by
            # the file's lines, and what was written before this transaction
            bad = exc.details.get("items", [])
            lines = [f"{path}:{numbers[start + b['index']]}: {b['message']}" for b in bad]
            kept = (f"nothing from line {numbers[start]} on was submitted; the {start:,} "
                    "line(s) before it were" if start else "nothing was submitted")
            raise Failure(f"{len(bad)} idempotency key(s) used before for a different "
                          f"request; {kept}\n" + "\n".join(lines)) from None
    return done


async def _follow(service: ExecutionService, execution: Execution) -> Execution:
    """Wait until the execution has ended (long waits, woken by its end)."""
    while not execution.status.is_terminal:
        execution = await service.wait(execution.id, MAX_WAIT)
    return execution


@contextlib.contextmanager
def _interrupted_wait(waiting: list[uuid.UUID]) -> Iterator[None]:
    """Ctrl-C (SIGINT) during ``--wait`` or ``--follow``: one ``error:`` line naming the
    execution waited on (it goes on, submitted or not by this command), exit 1."""
    try:
        yield
    except KeyboardInterrupt:
        if not waiting:
            raise
        raise Failure(f"interrupted while waiting for execution {waiting[-1]}; it goes on "
                      f"(`veracity get {waiting[-1]} --follow` waits again)") from None


def _show_ended(execution: Execution, as_json: bool) -> None:
    """Print an ended execution, its result whole; exit 1 unless it completed."""
    if as_json:
        print_json(execution_json(execution))
    else:
        print_execution(execution, whole=True)
    if execution.status != Status.COMPLETED:
        why = "" if execution.error is None else f": {short(execution.error, 500)}"
        raise Failure(f"execution {execution.id} ended {execution.status}{why}")


@cli.command()
@common_options
@json_option
@click.argument("ffqn", required=False)
@click.argument("params", nargs=-1, metavar="[PARAM]...")
@click.option("--params", "params_json", default=None, metavar="JSON",
              help="All parameters as one JSON array.")
@click.option("--idempotency-key", default=None, help="Submitting again returns the same one.")
@click.option("--scheduled-at", default=None, metavar="TIME",
              help="Not run before this time: ISO 8601 with its offset "
                   "(2030-01-01T00:00:00Z).")
@click.option("--paused", is_flag=True, help="Submit on hold (unpause to run it).")
@click.option("--from-file", "from_file", default=None, metavar="FILE.jsonl",
              type=click.Path(dir_okay=False),
              help="Submit every line of FILE (JSON Lines: {ffqn, params, idempotency_key, "
                   "scheduled_at, paused} each), 1,000 lines per transaction.")
@click.option("--wait", "wait", is_flag=True,
              help="Wait until it has ended, then print it with its result (exit 1 unless "
                   "it completed).")
def submit(config_path: str | None, database_url: str | None, app: str | None, as_json: bool,
           ffqn: str | None, params: tuple[str, ...], params_json: str | None,
           idempotency_key: str | None, scheduled_at: str | None, paused: bool,
           from_file: str | None, wait: bool) -> None:
    """Submit an execution of FFQN; each PARAM is a JSON value. Or every line of a JSON
    Lines file (--from-file)."""
    settings = settings_from(config_path, database_url=database_url, app=app)
    if from_file is not None:
        if ffqn is not None or params or params_json is not None or idempotency_key \
                or scheduled_at or paused or wait:
            raise click.UsageError("--from-file takes the submissions from the file: give "
                                   "no FFQN, PARAM, --params, --idempotency-key, "
                                   "--scheduled-at, --paused or --wait with it")
        items, refused, numbers = _submissions_from(from_file)
        done = run(with_runtime(settings, lambda rt: _submit_file(
            rt, from_file, items, refused, numbers)))
        if as_json:
            print_json({"items": [execution_json(e) for e, _ in done],
                        "created": [created for _, created in done]})
            return
        for execution, created in done:
            click.echo(f"{execution.id}  {'submitted' if created else 'already submitted'}")
        new = sum(1 for _, created in done if created)
        click.echo(f"{new} submitted, {len(done) - new} already submitted (same "
                   "idempotency key)")
        return
    if ffqn is None:
        raise click.UsageError("give FFQN (or --from-file FILE.jsonl)")
    values = _parse_params(params_json, params)
    when = parse_time("--scheduled-at", scheduled_at)

    waiting: list[uuid.UUID] = []  # the execution a wait is on (said if it is interrupted)

    async def go(rt: Runtime) -> tuple[Execution, bool, Execution | None]:
        execution, created = await rt.service.submit(
            ffqn, values, idempotency_key=idempotency_key, scheduled_at=when, paused=paused)
        if wait and not as_json:
            word = "submitted" if created else "already submitted (same idempotency key)"
            click.echo(f"{word}: {execution.id}; waiting for it to end", err=True)
        waiting.append(execution.id)
        return execution, created, (await _follow(rt.service, execution) if wait else None)

    with _interrupted_wait(waiting):
        execution, created, ended = run(with_runtime(settings, go))
    if ended is not None:
        _show_ended(ended, as_json)
    elif as_json:
        print_json(execution_json(execution))
    else:
        word = "submitted" if created else "already submitted (same idempotency key)"
        click.echo(f"{word}: {execution.id}")
        print_execution(execution)


@cli.command()
@common_options
@json_option
@click.argument("execution_id")
@click.option("--follow", is_flag=True,
              help="Wait until it has ended, then print it with its result (exit 1 unless "
                   "it completed).")
def get(config_path: str | None, database_url: str | None, app: str | None, as_json: bool,
        execution_id: str, follow: bool) -> None:
    """Show one execution."""
    settings = settings_from(config_path, database_url=database_url, app=app)

    followed: list[uuid.UUID] = []

    async def one(rt: Runtime) -> tuple[Execution, str | None]:
        execution = await rt.service.get(execution_id)
        if follow:
            followed.append(execution.id)
            if not execution.status.is_terminal and not as_json:
                click.echo(f"waiting for {execution.id} to end", err=True)
            return await _follow(rt.service, execution), None
        return execution, (await rt.service.waiting_reasons([execution])).get(execution.id)

    with _interrupted_wait(followed):
        execution, waiting = run(with_runtime(settings, one, read_only=True))
    if follow:
        _show_ended(execution, as_json)
    elif as_json:
        print_json(execution_json(execution, waiting))
    else:
        print_execution(execution, waiting)


@cli.command(name="list")
@common_options
@json_option
@click.option("--status", "statuses", multiple=True,
              type=click.Choice([s.value for s in Status]), help="Repeatable.")
@click.option("--ffqn-prefix", default=None)
@click.option("--deployment-id", default=None)
@click.option("--created-after", default=None, metavar="TIME")
@click.option("--created-before", default=None, metavar="TIME")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000))
@click.option("--cursor", default=None, help="next_cursor of the previous page.")
@click.option("--flagged", is_flag=True, help="Only executions flagged for an operator.")
def list_(config_path: str | None, database_url: str | None, app: str | None, as_json: bool,
          statuses: tuple[str, ...], ffqn_prefix: str | None, deployment_id: str | None,
          created_after: str | None, created_before: str | None, limit: int,
          cursor: str | None, flagged: bool) -> None:
    """List executions, newest first."""
    settings = settings_from(config_path, database_url=database_url, app=app)
    filt = ExecutionFilter(
        statuses=tuple(Status(s) for s in statuses),
        ffqn_prefix=ffqn_prefix,
        deployment_id=deployment_id,
        created_after=parse_time("--created-after", created_after),
        created_before=parse_time("--created-before", created_before),
        flagged=True if flagged else None,
    )
    page = run(with_runtime(settings, lambda rt: rt.service.page(filt, limit=limit,
                                                                 cursor=cursor),
                            read_only=True))
    if as_json:
        print_json({"items": [execution_json(e, page.waiting.get(e.id)) for e in page.items],
                    "next_cursor": page.next_cursor})
        return
    if not page.items:
        click.echo("nothing flagged" if flagged else "no executions")
        return
    print_table(
        ["id", "ffqn", "status", "attempt", "created at", "note"],
        [[str(e.id), short(e.ffqn, 50), str(e.status), str(e.attempt), fmt_time(e.created_at),
          page.waiting.get(e.id, "") or (f"flagged: {e.flag_reason}" if e.flagged_at else "")]
         for e in page.items],
    )
    if page.next_cursor:
        click.echo(f"more: --cursor {page.next_cursor}")


@cli.command()
@common_options
@json_option
@click.argument("execution_id")
@click.option("--limit", default=1000, show_default=True, type=click.IntRange(1, 10_000),
              help="Events on this page.")
@click.option("--cursor", default=None, type=click.IntRange(0, 2**31 - 1),
              help="next_cursor of the previous page (the last seq shown).")
@click.option("--full", is_flag=True, help="Show each event's data whole (not shortened).")
def history(config_path: str | None, database_url: str | None, app: str | None, as_json: bool,
            execution_id: str, limit: int, cursor: int | None, full: bool) -> None:
    """Show an execution's history, oldest first, a page at a time (as GET
    /v1/executions/{id}/history: `more: --cursor N` when there is more)."""
    settings = settings_from(config_path, database_url=database_url, app=app)
    events, after = run(with_runtime(
        settings, lambda rt: rt.service.history_page(execution_id, after_seq=cursor or 0,
                                                     limit=limit),
        read_only=True))
    if as_json:
        print_json({"items": [event_json(ev) for ev in events],
                    "next_cursor": None if after is None else str(after)})
        return
    if full:
        for ev in events:
            click.echo(f"{ev.seq}  {fmt_time(ev.at)}  {ev.kind}")
            click.echo(json.dumps(ev.data, indent=2, ensure_ascii=False, sort_keys=True))
    else:
        print_table(["seq", "at", "kind", "data"],
                    [[str(ev.seq), fmt_time(ev.at), ev.kind, short(ev.data, 90)]
                     for ev in events])
    if after is not None:
        click.echo(f"more: --cursor {after}")


async def replay_execution(rt: Runtime, execution_id: str) -> ReplayResult:
    """Read an execution's whole history and replay it against the app's current code
    (docs/workflows.md, "Checking a code change against production histories")."""
    _load()
    execution = await rt.service.get(execution_id)
    workflow = rt.external.workflows.get(execution.ffqn)
    if execution.engine is not None or workflow is not None:
        engine = execution.engine or (workflow.engine if workflow else "")
        raise InvalidInput(
            f"execution {execution.id} runs {execution.ffqn} in the external engine "
            f"{engine}: replay applies to Veracity's own workflows, whose calls are "
            "recorded in their history", code="not_replayable")
    if rt.app is None:
        raise InvalidInput("replay needs the app whose code to check: give --app "
                           "MODULE:ATTR, VERACITY_APP or app in the configuration",
                           code="no_app")
    if execution.ffqn not in rt.app:
        raise InvalidInput(
            f"execution {execution.id} runs workflow {execution.ffqn!r}, which the app "
            f"{rt.settings.app} does not register (it registers: "
            f"{', '.join(rt.app) or 'none'})", code="unknown_workflow")
    events: list[HistoryEvent] = []
    while True:  # all of it, page by page: a replay of part of it would stop short
        after = events[-1].seq if events else 0
        page = await rt.store.history_list(execution.id, after_seq=after,
                                           limit=MAX_HISTORY_LIMIT)
        events.extend(page)
        if len(page) < MAX_HISTORY_LIMIT:
            return await replay_async(rt.app, events)


@cli.command(name="replay")
@common_options
@json_option
@click.argument("execution_id")
def replay_(config_path: str | None, database_url: str | None, app: str | None,
            as_json: bool, execution_id: str) -> None:
    """Replay an execution's history against the app's current workflow code.

    Nothing is run or written: each recorded call is compared with the call the code makes
    now. Exit 0 when the code is consistent with the history, 1 at the first divergence.
    """
    settings = settings_from(config_path, database_url=database_url, app=app)
    result = run(with_runtime(settings, lambda rt: replay_execution(rt, execution_id)))
    if as_json:
        print_json(result.to_json())
    else:
        for line in replay_lines(result):
            click.echo(line)
    if not result.consistent:
        sys.exit(1)


def replay_lines(result: ReplayResult) -> list[str]:
    """What `veracity replay` prints (docs/workflows.md shows it)."""
    return [*fields_lines([
        ("id", str(result.execution_id)),
        ("ffqn", result.ffqn),
        ("consistent", "yes" if result.consistent else "NO"),
        ("position", "-" if result.position is None else str(result.position)),
        ("calls replayed", str(result.replayed)),
        ("ran to its end", "yes" if result.finished else "no"),
    ]), result.message]


def _control(name: str, help_text: str) -> None:
    @cli.command(name=name, help=help_text)
    @common_options
    @json_option
    @click.argument("execution_id")
    def command(config_path: str | None, database_url: str | None, app: str | None,
                as_json: bool, execution_id: str) -> None:
        settings = settings_from(config_path, database_url=database_url, app=app)

        async def go(rt: Runtime) -> tuple[Execution, bool]:
            method = getattr(rt.service, name)
            result: tuple[Execution, bool] = await _or_refused(
                name, execution_id, method(execution_id, actor="cli"))
            return result

        # a cancel may have to ask a delegated run's engine to stop it
        execution, changed = run(with_runtime(settings, go, engines=name == "cancel"))
        _report(name, execution, changed, as_json)


async def _or_refused(action: str, execution_id: str, call: Awaitable[T]) -> T:
    """``call``'s answer; a refusal (409) said as :func:`_refused` says it."""
    try:
        return await call
    except Conflict as exc:
        raise _refused(action, execution_id, exc) from None


def _refused(action: str, execution_id: str, exc: Conflict) -> Failure:
    """A refusal said as the command's: what could not be done, to which execution, and
    why; a hint to the API's route said as the command to use."""
    why = re.sub(r"\(PUT /v1/executions/([0-9a-f-]+)/pause\)", r"(veracity pause \1)",
                 exc.message)
    return Failure(f"cannot {action} {execution_id}: {why}")


def _report(name: str, execution: Execution, changed: bool, as_json: bool) -> None:
    if as_json:
        print_json({**execution_json(execution), "changed": changed})
        return
    note = "" if changed else " (nothing to change)"
    if execution.status == Status.RUNNING and name == "cancel" \
            and execution.cancel_requested_at is not None:
        note = ("; cancel requested: its engine was asked to stop the run, and it ends "
                "cancelled once the engine confirms" if execution.engine
                else "; cancel requested: it stops at its next step")
    elif execution.status == Status.RUNNING and name == "pause" \
            and execution.pause_requested_at is not None:
        note = "; pause requested: it parks at its next step"
    click.echo(f"{name}: {execution.id} is {execution.status}{note}")


@cli.command()
@common_options
@json_option
@click.argument("execution_id")
def retry(config_path: str | None, database_url: str | None, app: str | None,
          as_json: bool, execution_id: str) -> None:
    """Retry a failed execution: a new one that replays its recorded calls up to the
    failure and runs on from there (the failed one is left as it is)."""
    settings = settings_from(config_path, database_url=database_url, app=app)
    created = run(with_runtime(settings, lambda rt: _or_refused(
        "retry", execution_id, rt.service.retry(execution_id, actor="cli"))))
    if as_json:
        print_json(execution_json(created))
    else:
        click.echo(f"retried: {created.id} (retry of {created.retry_of})")


_control("cancel", "Cancel a -cancellable execution (and its cancellable children).")


@cli.command(name="pause")
@common_options
@json_option
@click.argument("execution_id")
@click.option("--reason", default=None, help="Why (recorded in its history).")
@click.option("--by", "by", default="cli", show_default=True, help="Who pauses it.")
def pause(config_path: str | None, database_url: str | None, app: str | None,
          as_json: bool, execution_id: str, reason: str | None, by: str) -> None:
    """Hold an execution: it is not run until unpaused (a running one parks at its next
    step); who and why are recorded and said by its waiting reason."""
    settings = settings_from(config_path, database_url=database_url, app=app)
    execution, changed = run(with_runtime(settings, lambda rt: _or_refused(
        "pause", execution_id, rt.service.pause(execution_id, actor=by, reason=reason))))
    _report("pause", execution, changed, as_json)


_control("unpause", "Release a paused execution.")


@cli.command()
@common_options
@json_option
@click.argument("execution_id")
@click.argument("topic")
@click.argument("payload", required=False, default="null")
def send(config_path: str | None, database_url: str | None, app: str | None, as_json: bool,
         execution_id: str, topic: str, payload: str) -> None:
    """Send a message on TOPIC to an execution; PAYLOAD is a JSON value (default null)."""
    settings = settings_from(config_path, database_url=database_url, app=app)
    try:
        value = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="PAYLOAD") from None

    async def go(rt: Runtime) -> tuple[Execution, Message]:
        return await _or_refused("send to", execution_id,
                                 rt.service.send(execution_id, topic, value))

    execution, message = run(with_runtime(settings, go))
    if as_json:
        print_json({"message_id": message.id, "execution_id": str(execution.id),
                    "topic": message.topic, "created_at": message.created_at.isoformat()})
    else:
        click.echo(f"sent message {message.id} on {topic!r} to {execution.id} "
                   f"({execution.status})")


@cli.command()
@common_options
@json_option
@click.argument("execution_id")
@click.option("--attach", "attach", default=None, metavar="EXTERNAL_ID",
              help="Attach the engine's execution id.")
@click.option("--fail", "fail_", is_flag=True, help="End the run as failed_transient.")
@click.option("--cancel", "cancel_", is_flag=True, help="End the run as cancelled.")
@click.option("--reason", required=True, help="Why (recorded in history).")
@click.option("--by", default=None, help="Who resolves it (default: $USER).")
@click.option("--force", is_flag=True,
              help="With --fail/--cancel: end it even if the engine cannot confirm the run "
                   "finished (recorded as forced; it stays on the flagged list).")
def resolve(config_path: str | None, database_url: str | None, app: str | None,
            as_json: bool, execution_id: str, attach: str | None, fail_: bool,
            cancel_: bool, reason: str, by: str | None, force: bool) -> None:
    """Resolve a flagged external execution: --attach ID, --fail or --cancel.

    --fail and --cancel ask the engine to stop the run and end the execution only once
    the engine confirms it finished; --force ends it without that confirmation.
    """
    chosen = [name for name, on in (("attach", attach is not None), ("fail", fail_),
                                    ("cancel", cancel_)) if on]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of --attach ID, --fail, --cancel")
    settings = settings_from(config_path, database_url=database_url, app=app)
    actor = by or os.environ.get("USER") or "cli"

    async def go(rt: Runtime) -> Resolved:
        # not _or_refused: a 409 here may say the request was recorded and waits for the
        # engine's confirmation, which is no refusal
        return await rt.service.resolve(execution_id, action=chosen[0], external_id=attach,
                                        reason=reason, actor=actor, force=force)

    resolved = run(with_runtime(settings, go, engines=True))
    execution = resolved.execution
    if resolved.unconfirmed:
        click.echo(f"warning: {execution.id} ended {execution.status} WITHOUT the engine's "
                   f"confirmation ({resolved.message}); the run may still be going in the "
                   "engine: check it there. It stays on the flagged list.", err=True)
    if as_json:
        print_json({**execution_json(execution), "resolution": resolved.outcome})
    elif resolved.outcome == "stop_requested":
        click.echo(f"resolve ({chosen[0]}): {execution.id} is still {execution.status}: "
                   f"{resolved.message}")
    else:
        click.echo(f"resolved ({chosen[0]}): {execution.id} is {execution.status}")


# -- API tokens (docs/security.md) ---------------------------------------------------------


@cli.group()
def token() -> None:
    """Scoped API tokens for the HTTP API: create, list, revoke.

    Tokens live in the database (hashed); these commands talk to it directly and need no
    token themselves."""


async def with_tokens(settings: Settings, fn: Callable[[TokenService], Awaitable[T]]) -> T:
    store = await open_store(settings.database_url, create=False)  # never a new file
    try:
        await store.check_session()  # as with_runtime
        return await fn(TokenService(store))
    finally:
        await store.close()


def token_json(t: ApiToken, state: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": t.name, "key_id": t.key_id, "scopes": list(t.scopes),
        "created_at": t.created_at.isoformat(),
        "expires_at": t.expires_at.isoformat() if t.expires_at else None,
        "revoked_at": t.revoked_at.isoformat() if t.revoked_at else None,
        "last_used_at": t.last_used_at.isoformat() if t.last_used_at else None,
    }
    if state is not None:
        out["state"] = state
    return out


SCOPES_HELP = ("Repeatable: executions:read, executions:submit, executions:cancel, "
               "executions:pause, executions:send, executions:resolve, admin (all).")


@token.command(name="create")
@common_options
@json_option
@click.option("--name", required=True, help="A name of its own (letters, digits, . _ -).")
@click.option("--scope", "scopes", multiple=True, required=True, metavar="SCOPE",
              help=SCOPES_HELP)
@click.option("--expires", default=None, metavar="LIFETIME",
              help="e.g. 30d, 12h, 90m, 2w (default: never).")
def token_create(config_path: str | None, database_url: str | None, app: str | None,
                 as_json: bool, name: str, scopes: tuple[str, ...], expires: str | None
                 ) -> None:
    """Create a token and print it, once: only its SHA-256 digest is kept.

    The token alone goes to stdout (TOKEN=$(veracity token create ...)), the rest to
    stderr."""
    settings = settings_from(config_path, database_url=database_url, app=app)
    created: CreatedToken = run(with_tokens(
        settings, lambda tokens: tokens.create(name, scopes, expires)))
    record = created.record
    if as_json:
        print_json({**token_json(record), "token": created.token})
        return
    until = (f"expires {fmt_time(record.expires_at)}" if record.expires_at
             else "never expires")
    click.echo(f"created API token {record.name!r} ({', '.join(record.scopes)}; {until}); "
               "it is shown only this once: Veracity keeps only its digest", err=True)
    click.echo(created.token)


@token.command(name="list")
@common_options
@json_option
def token_list(config_path: str | None, database_url: str | None, app: str | None,
               as_json: bool) -> None:
    """List every token, oldest first: never the token itself."""
    settings = settings_from(config_path, database_url=database_url, app=app)
    views: list[TokenView] = run(with_tokens(settings, lambda tokens: tokens.list()))
    if as_json:
        print_json({"items": [token_json(v.record, str(v.state)) for v in views]})
        return
    print_table(
        ["name", "key id", "scopes", "state", "created at", "expires at", "revoked at",
         "last used"],
        [[v.record.name, v.record.key_id, ", ".join(v.record.scopes), str(v.state),
          fmt_time(v.record.created_at), fmt_time(v.record.expires_at),
          fmt_time(v.record.revoked_at), fmt_time(v.record.last_used_at)] for v in views],
    )


@token.command(name="revoke")
@common_options
@json_option
@click.argument("name")
def token_revoke(config_path: str | None, database_url: str | None, app: str | None,
                 as_json: bool, name: str) -> None:
    """Revoke the token NAME: refused (401) from the next request on. It stays listed."""
    settings = settings_from(config_path, database_url=database_url, app=app)
    record, changed = run(with_tokens(settings, lambda tokens: tokens.revoke(name)))
    if as_json:
        print_json({**token_json(record, "revoked"), "changed": changed})
    elif changed:
        click.echo(f"revoked API token {record.name!r}: requests with it are refused "
                   "from now on")
    else:
        click.echo(f"API token {record.name!r} was revoked already at "
                   f"{fmt_time(record.revoked_at)} (nothing to change)")


def main() -> None:
    cli(prog_name="veracity")


