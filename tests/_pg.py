"""PostgreSQL helpers for the test suite (no pytest here, so they can be reused by scripts).

* :func:`server_answers` / :func:`find_pg_bin_dir` decide where the tests get a server.
* :class:`TempCluster` is a throwaway cluster in a temporary folder on a free port.
* :func:`create_database_from_template` / :func:`drop_database` clone and drop databases.
* :class:`DatabasePool` hands each test a migrated database: a clone of the template, or one
  an earlier test of this process used, renamed and reset to the template's state: every
  object and row (:func:`database_state` is how that is checked); a small table may keep
  dead rows, which no query sees.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
URL_ENV = "VERACITY_TEST_DATABASE_URL"
PG_SYSTEM_USER = "postgres"
_PG_LIB_ROOT = Path("/usr/lib/postgresql")
_TMPFS = Path("/dev/shm")
_TMPFS_MIN_FREE = 1 << 30


class ClusterError(RuntimeError):
    """A throwaway cluster could not be set up (the message is meant for the user)."""


def server_answers(url: str) -> bool:
    """True if a PostgreSQL server accepts a connection at *url* (3 s timeout)."""
    try:
        with psycopg.connect(url, connect_timeout=3, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


def _has_server_binaries(bin_dir: Path) -> bool:
    return all(os.access(bin_dir / name, os.X_OK) for name in ("initdb", "pg_ctl", "postgres"))


def _version_key(path: Path) -> tuple[int, ...]:
    """``/usr/lib/postgresql/15/bin`` -> ``(15,)``; non-numeric versions sort last."""
    parts = re.findall(r"\d+", path.parent.name)
    return tuple(int(p) for p in parts) if parts else (-1,)


def find_pg_bin_dir() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl``: from PATH first, then the newest
    ``/usr/lib/postgresql/*/bin`` (Debian/Ubuntu keep them off PATH)."""
    initdb = shutil.which("initdb")
    if initdb is not None:
        bin_dir = Path(initdb).resolve().parent
        if _has_server_binaries(bin_dir):
            return bin_dir
    candidates = sorted(_PG_LIB_ROOT.glob("*/bin"), key=_version_key, reverse=True)
    for bin_dir in candidates:
        if _has_server_binaries(bin_dir):
            return bin_dir
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def tmpfs_with_room() -> Path | None:
    """``/dev/shm`` when it is a folder we may write in with at least 1 GiB free (a tmpfs
    on Linux: files in memory, fsync costs nothing), else ``None``."""
    try:
        st = os.statvfs(_TMPFS)
        if os.access(_TMPFS, os.W_OK | os.X_OK) and st.f_bavail * st.f_frsize >= _TMPFS_MIN_FREE:
            return _TMPFS
    except OSError:
        pass
    return None


def default_cluster_parent() -> Path:
    """Where throwaway clusters live: ``/dev/shm`` (:func:`tmpfs_with_room`), as cloning a
    database there takes ~15 ms instead of hundreds on a slow disk; otherwise the usual
    temporary folder."""
    return tmpfs_with_room() or Path(tempfile.gettempdir())


@dataclass(frozen=True)
class _RunAs:
    uid: int
    gid: int
    name: str


def _run_as() -> _RunAs | None:
    """Who runs initdb/pg_ctl: ``None`` for the current user, the ``postgres`` system user
    when we are root (PostgreSQL refuses to run as root)."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(PG_SYSTEM_USER)
    except KeyError:
        raise ClusterError(
            f"running as root, PostgreSQL's initdb/pg_ctl must run as another user, and "
            f"there is no {PG_SYSTEM_USER!r} system user (create one, run the tests as a "
            f"normal user, or set {URL_ENV})"
        ) from None
    return _RunAs(uid=entry.pw_uid, gid=entry.pw_gid, name=entry.pw_name)


class TempCluster:
    """A throwaway PostgreSQL cluster: trust auth, 127.0.0.1 on a free port, unix socket
    inside its folder, fsync off. ``stop()`` removes the folder (also called at exit).

    The folder goes under *parent* (default: :func:`default_cluster_parent`). When run as
    root, initdb/pg_ctl run as the ``postgres`` system user, who must be able to enter
    *parent*; the folder itself is chowned to that user."""

    def __init__(
        self,
        bin_dir: Path | None = None,
        *,
        parent: Path | None = None,
        superuser: str = "postgres",
    ) -> None:
        found = bin_dir or find_pg_bin_dir()
        if found is None:
            raise ClusterError("PostgreSQL server binaries (initdb, pg_ctl) were not found")
        self.bin_dir = found
        self.parent = parent
        self.superuser = superuser
        self.folder: Path | None = None
        self.port: int | None = None
        self._run_as: _RunAs | None = None

    @property
    def data_dir(self) -> Path:
        assert self.folder is not None, "cluster not started"
        return self.folder / "data"

    @property
    def log_file(self) -> Path:
        assert self.folder is not None, "cluster not started"
        return self.folder / "postgres.log"

    @property
    def url(self) -> str:
        if self.port is None:
            raise ClusterError("cluster not started")
        return f"postgresql://{quote(self.superuser)}@127.0.0.1:{self.port}/postgres"

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, *, attempts: int = 3) -> TempCluster:
        if self.folder is not None:
            raise ClusterError("cluster already started")
        self._run_as = _run_as()
        parent = self.parent or default_cluster_parent()
        self.folder = Path(tempfile.mkdtemp(prefix="veracity-pg-", dir=parent))
        atexit.register(self.stop)
        try:
            if self._run_as is not None:
                os.chown(self.folder, self._run_as.uid, self._run_as.gid)
            self._initdb()
            last_error = ""
            for _ in range(attempts):
                port = free_port()
                result = self._run(
                    "pg_ctl",
                    "start",
                    "-w",
                    "-t",
                    "60",
                    "-D",
                    str(self.data_dir),
                    "-l",
                    str(self.log_file),
                    "-o",
                    f"-p {port}",
                )
                if result.returncode == 0:
                    self.port = port
                    return self
                # Most likely someone took the port between free_port() and bind: retry.
                last_error = self._describe_failure(result)
            raise ClusterError(f"pg_ctl start failed: {last_error}")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the server (immediate mode) and remove the folder. Idempotent."""
        folder = self.folder
        atexit.unregister(self.stop)
        if folder is None:
            return
        data_dir = folder / "data"
        try:
            if (data_dir / "postmaster.pid").exists():
                result = self._run(
                    "pg_ctl", "stop", "-w", "-t", "30", "-m", "immediate", "-D", str(data_dir)
                )
                if result.returncode != 0:
                    _kill_postmaster(data_dir)
        finally:
            self.folder = None
            self.port = None
            shutil.rmtree(folder, ignore_errors=True)

    def halt(self) -> None:
        """Stop the server but keep the cluster (a database outage): ``resume()`` brings it
        back on the same port with its data."""
        if self.folder is None or self.port is None:
            raise ClusterError("cluster not started")
        result = self._run("pg_ctl", "stop", "-w", "-t", "30", "-m", "fast",
                           "-D", str(self.data_dir))
        if result.returncode != 0:
            raise ClusterError(f"pg_ctl stop failed: {self._describe_failure(result)}")

    def resume(self) -> None:
        """Start a halted server again on its port."""
        if self.folder is None or self.port is None:
            raise ClusterError("cluster not started")
        result = self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data_dir),
                           "-l", str(self.log_file), "-o", f"-p {self.port}")
        if result.returncode != 0:
            raise ClusterError(f"pg_ctl start failed: {self._describe_failure(result)}")

    def __enter__(self) -> TempCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals ----------------------------------------------------------------------

    def _initdb(self) -> None:
        result = self._run(
            "initdb",
            "-D",
            str(self.data_dir),
            "-U",
            self.superuser,
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )
        if result.returncode != 0:
            raise ClusterError(f"initdb failed: {self._describe_failure(result)}")
        assert self.folder is not None
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": _conf_quote(str(self.folder)),
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "200",
        }
        with (self.data_dir / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.write("\n# veracity test cluster\n")
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())

    def _run(self, program: str, *args: str) -> subprocess.CompletedProcess[str]:
        assert self.folder is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        kwargs: dict[str, Any] = {}
        if self._run_as is not None:
            env["HOME"] = str(self.folder)
            env["USER"] = env["LOGNAME"] = self._run_as.name
            kwargs = {"user": self._run_as.uid, "group": self._run_as.gid, "extra_groups": []}
        return subprocess.run(
            [str(self.bin_dir / program), *args],
            cwd=self.folder,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            **kwargs,
        )

    def _describe_failure(self, result: subprocess.CompletedProcess[str]) -> str:
        text = (result.stderr or result.stdout or "").strip()
        with contextlib.suppress(OSError):
            if self.folder is not None and self.log_file.exists():
                tail = self.log_file.read_text(errors="replace").strip().splitlines()[-5:]
                text = "; ".join([text, *tail]) if text else "; ".join(tail)
        return " ".join(text.split()) or f"exit status {result.returncode}"


def _conf_quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def _kill_postmaster(data_dir: Path) -> None:
    """Last resort when ``pg_ctl stop`` failed: SIGQUIT the postmaster from its pid file."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        pid = int((data_dir / "postmaster.pid").read_text().splitlines()[0])
        os.kill(pid, signal.SIGQUIT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            os.kill(pid, 0)  # raises ProcessLookupError (an OSError) once it is gone
            time.sleep(0.05)


# -- databases --------------------------------------------------------------------------


def with_database(url: str, dbname: str) -> str:
    """*url* with its database name replaced by *dbname* (other parts and query params
    kept; a ``dbname`` query parameter, which would win over the path, is dropped)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "dbname"]
    return urlunsplit(
        (parts.scheme, parts.netloc, "/" + quote(dbname, safe=""), urlencode(query), parts.fragment)
    )


def _admin_connect(server_url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(server_url, autocommit=True, connect_timeout=10)


def create_database(server_url: str, name: str) -> None:
    """``CREATE DATABASE name`` (from the server's default template)."""
    with _admin_connect(server_url) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def create_database_from_template(
    server_url: str, name: str, template: str, *, busy_timeout: float = 10.0
) -> None:
    """``CREATE DATABASE name TEMPLATE template STRATEGY FILE_COPY`` (no STRATEGY before
    PostgreSQL 15). FILE_COPY copies the files with one checkpoint instead of WAL-logging
    every block, which is the fast path for small databases.

    Retries while the template is still "being accessed by other users" (a just-closed
    connection whose backend has not exited yet).
    """
    with _admin_connect(server_url) as conn:
        if conn.info.server_version >= 150000:
            stmt = sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY")
        else:
            stmt = sql.SQL("CREATE DATABASE {} TEMPLATE {}")
        query = stmt.format(sql.Identifier(name), sql.Identifier(template))
        deadline = time.monotonic() + busy_timeout
        while True:
            try:
                conn.execute(query)
                return
            except pg_errors.ObjectInUse:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)


def drop_database(server_url: str, name: str) -> None:
    """``DROP DATABASE IF EXISTS name WITH (FORCE)``: connections left open are
    terminated (before PostgreSQL 13, terminated by hand first)."""
    with _admin_connect(server_url) as conn:
        if conn.info.server_version >= 130000:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
        else:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))


def database_exists(server_url: str, name: str) -> bool:
    with _admin_connect(server_url) as conn:
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        return row is not None


# -- reusing databases -------------------------------------------------------------------

_USER_NAMESPACE = (
    "n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'"
)

# What a test can see of a database besides the rows of its tables: every object of the
# user schemas, as text (definitions, never OIDs, so that equal databases compare equal).
_STATE_QUERY = f"""
SELECT 'schema', n.nspname || ' ' || coalesce(n.nspacl::text, '')
  FROM pg_namespace n WHERE {_USER_NAMESPACE}
UNION ALL
SELECT 'relation', n.nspname || '.' || c.relname || ' ' || c.relkind::text || c.relpersistence::text
       || ' rls=' || c.relrowsecurity || ' acl=' || coalesce(c.relacl::text, '')
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {_USER_NAMESPACE}
UNION ALL
SELECT 'column', n.nspname || '.' || c.relname || ' #' || a.attnum || ' ' || a.attname || ' '
       || format_type(a.atttypid, a.atttypmod) || ' notnull=' || a.attnotnull
       || ' default=' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
  FROM pg_attribute a
  JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
 WHERE {_USER_NAMESPACE} AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'constraint', n.nspname || '.' || co.conname || ' on ' || co.conrelid::regclass::text
       || ' ' || pg_get_constraintdef(co.oid)
  FROM pg_constraint co JOIN pg_namespace n ON n.oid = co.connamespace WHERE {_USER_NAMESPACE}
UNION ALL
SELECT 'index', schemaname || '.' || indexname || ' ' || indexdef
  FROM pg_indexes WHERE schemaname NOT IN ('pg_catalog', 'information_schema')
UNION ALL
SELECT 'trigger', pg_get_triggerdef(t.oid) || ' enabled=' || t.tgenabled::text
  FROM pg_trigger t WHERE NOT t.tgisinternal
UNION ALL
SELECT 'function', CASE WHEN p.prokind IN ('f', 'p') THEN pg_get_functiondef(p.oid)
                        ELSE n.nspname || '.' || p.proname || ' ' || p.prokind::text END
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE {_USER_NAMESPACE}
UNION ALL
SELECT 'type', n.nspname || '.' || t.typname || ' ' || t.typtype::text
  FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE {_USER_NAMESPACE}
UNION ALL
SELECT 'enum', t.typname || ' ' || e.enumsortorder || ' ' || e.enumlabel
  FROM pg_enum e JOIN pg_type t ON t.oid = e.enumtypid
UNION ALL
SELECT 'sequence', schemaname || '.' || sequencename || ' ' || concat_ws(' ', start_value,
       min_value, max_value, increment_by, cycle, cache_size, 'last=' || last_value)
  FROM pg_sequences
UNION ALL
SELECT 'view', schemaname || '.' || viewname || ' ' || definition
  FROM pg_views WHERE schemaname NOT IN ('pg_catalog', 'information_schema')
UNION ALL
SELECT 'rule', schemaname || '.' || rulename || ' ' || definition
  FROM pg_rules WHERE schemaname NOT IN ('pg_catalog', 'information_schema')
UNION ALL
SELECT 'policy', schemaname || '.' || tablename || '.' || policyname || ' ' || cmd || ' '
       || coalesce(qual, '') || ' ' || coalesce(with_check, '')
  FROM pg_policies
UNION ALL
SELECT 'extension', extname || ' ' || extversion FROM pg_extension
UNION ALL
SELECT 'event trigger', evtname || ' ' || evtevent FROM pg_event_trigger
UNION ALL
SELECT 'statistics', c.relname || '.' || s.staattnum
  FROM pg_statistic s JOIN pg_class c ON c.oid = s.starelid
  JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {_USER_NAMESPACE}
UNION ALL
SELECT 'large objects', count(*)::text FROM pg_largeobject_metadata
UNION ALL
SELECT 'prepared transactions', count(*)::text FROM pg_prepared_xacts
 WHERE database = current_database()
"""

_USER_TABLES = f"""
SELECT n.nspname, c.relname, pg_relation_size(c.oid) > 0
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE {_USER_NAMESPACE} AND c.relkind = 'r'
 ORDER BY 1, 2
"""


_EMPTIED_BY_DELETE_BYTES = 8 * 8192
"""A table a test left at most this big (8 pages, its TOAST table's included), and never
analysed, is emptied with ``DELETE`` instead of ``TRUNCATE`` (see :class:`DatabasePool`)."""

_TABLES_TO_EMPTY = f"""
SELECT n.nspname, c.relname, pg_table_size(c.oid),
       c.reltuples >= 0 OR EXISTS (SELECT 1 FROM pg_statistic s WHERE s.starelid = c.oid)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE {_USER_NAMESPACE} AND c.relkind = 'r' AND pg_relation_size(c.oid) > 0
"""
# pg_table_size: the table's pages, its TOAST table's (large values) and their maps


def _table(schema: str, table: str) -> sql.Identifier:
    return sql.Identifier(schema, table)


def database_state(conn: psycopg.Connection[Any]) -> tuple[list[str], dict[str, str]]:
    """What a test can see of the database *conn* is connected to: its objects (sorted
    text lines) and, per table that has rows, a digest of all its rows (a freshly migrated
    database has rows only in the migrations ledger)."""
    objects = sorted(
        f"{kind}: {detail}" for kind, detail in conn.execute(_STATE_QUERY).fetchall()
    )
    rows: dict[str, str] = {}
    for schema, table, has_pages in conn.execute(_USER_TABLES).fetchall():
        if not has_pages:  # no page at all: no row, live or dead
            continue
        query = sql.SQL(
            "SELECT count(*), md5(coalesce(string_agg(t::text, E'\\n' ORDER BY t::text), ''))"
            " FROM {} t"
        ).format(_table(schema, table))
        count, digest = conn.execute(query).fetchone() or (0, "")
        if count:
            rows[f"{schema}.{table}"] = f"{count} rows, md5 {digest}"
    return objects, rows


class DatabasePool:
    """Migrated databases for the tests of one process, reused from test to test.

    :meth:`acquire` returns the name of a database in the state of *template*
    (a database migrated once), which no other test uses while it is out. That is a new
    clone of the template, or a database an earlier test used and gave back
    (:meth:`release`), which was then, on a helper thread while the next test ran:

    * renamed, after ending every connection to it: a process or connection a test left
      behind can no more reach it under its old name than it could reach a dropped database
      (and whatever it wrote before is emptied below);
    * emptied: every table the template has no rows in, if it has a page at all, and every
      sequence used since is restarted. A table of at most 8 pages (its TOAST table's
      included) that was never analysed nor vacuumed is emptied with ``DELETE`` (triggers
      and foreign keys off): its dead rows stay, invisible to every query, and the planner
      sizes it as it sizes an empty one (a never-analysed table of under 10 pages is taken
      to have 10). Any other is truncated (``RESTART IDENTITY``). A ``TRUNCATE`` makes new
      files for a table and each of its indexes, about 2 ms of the server's CPU per
      relation and most of what a reset cost, where a ``DELETE`` of a few rows costs a
      fraction of a millisecond. What ``ANALYZE`` left in ``pg_statistic`` is deleted
      (``TRUNCATE`` keeps it, and the planner would go on using it);
    * checked: its objects and the rows of the template's non-empty tables (the migrations
      ledger) must be what :func:`database_state` says of the template, and nothing may be
      set on the database itself (``ALTER DATABASE ... SET``, ``ALLOW_CONNECTIONS``,
      ``CONNECTION LIMIT``). Otherwise (a test changed the schema, the ledger or the
      database's settings) it is dropped, and the next test gets a new clone instead.

    Up to *size* databases take turns (one in use while the one before is reset).
    :meth:`close` drops them all.
    """

    def __init__(
        self, server_url: str, template: str, *, prefix: str = "veracity_t", size: int = 2
    ) -> None:
        self.server_url = server_url
        self.template = template
        self.prefix = prefix
        self.size = size
        with psycopg.connect(with_database(server_url, template), autocommit=True) as conn:
            self._objects, self._rows = database_state(conn)
        self._kept_tables = set(self._rows)
        self._lock = threading.Lock()
        self._names: set[str] = set()  # every database of the pool, under any name it had
        self._resets: deque[Future[str | None]] = deque()  # released, oldest first
        self._count = 0  # databases in use, being reset or ready
        self._helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="veracity-db-reset")
        self._admin: psycopg.Connection[Any] | None = None  # the helper thread's, kept
        self.cloned = 0
        self.reused = 0

    def _new_name(self) -> str:
        name = f"{self.prefix}_{uuid.uuid4().hex}"
        with self._lock:
            self._names.add(name)
        return name

    def acquire(self) -> str:
        """The name of a database in the template's state, for one test."""
        done = [f for f in self._resets if f.done()]
        if done:
            pick: Future[str | None] | None = done[0]
        elif self._resets and self._count >= self.size:
            pick = self._resets[0]
        else:
            pick = None
        if pick is not None:
            self._resets.remove(pick)
            try:
                name = pick.result()
            except BaseException:
                self._count -= 1
                raise
            if name is not None:
                self.reused += 1
                return name
            self._count -= 1  # it was dropped
        name = self._new_name()
        create_database_from_template(self.server_url, name, self.template)
        self._count += 1
        self.cloned += 1
        return name

    def release(self, name: str) -> None:
        """Give back a database after its test: it is reset on the helper thread."""
        self._resets.append(self._helper.submit(self._reset, name))

    def close(self) -> None:
        """Wait for the resets under way, then drop every database of the pool."""
        self._helper.shutdown(wait=True)
        self._resets.clear()
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        with self._lock:
            names = sorted(self._names)
            self._names.clear()
        for name in names:
            drop_database(self.server_url, name)
        self._count = 0

    # -- internals ----------------------------------------------------------------------

    def _reset(self, name: str) -> str | None:
        """*name* renamed and reset to the template's state: its new name; ``None`` (and
        the database dropped) if it cannot be brought back to exactly that state."""
        new = self._new_name()
        if self._admin is None or self._admin.closed or self._admin.broken:
            self._admin = _admin_connect(self.server_url)  # one per pool: a connection costs
            # the server a process (about 5 ms of CPU per reset)
        _rename_when_free(self._admin, name, new)
        with self._lock:
            self._names.discard(name)
        row = self._admin.execute(
            "SELECT d.datallowconn AND d.datconnlimit = -1 AND NOT EXISTS ("
            " SELECT 1 FROM pg_db_role_setting s WHERE s.setdatabase = d.oid)"
            " FROM pg_database d WHERE d.datname = %s",
            (new,),
        ).fetchone()
        if row is None or not row[0]:
            self._drop(new)
            return None
        with psycopg.connect(with_database(self.server_url, new), autocommit=True) as conn:
            conn.execute("SET synchronous_commit = off")  # nothing here needs to survive a crash
            self._empty(conn)
            same = database_state(conn) == (self._objects, self._rows)
        if not same:
            self._drop(new)
            return None
        return new

    def _drop(self, name: str) -> None:
        drop_database(self.server_url, name)
        with self._lock:
            self._names.discard(name)

    def _empty(self, conn: psycopg.Connection[Any]) -> None:
        deleted: list[sql.Identifier] = []
        truncated: list[sql.Identifier] = []
        for schema, table, size, analysed in conn.execute(_TABLES_TO_EMPTY).fetchall():
            if f"{schema}.{table}" in self._kept_tables:
                continue
            small = size <= _EMPTIED_BY_DELETE_BYTES and not analysed
            (deleted if small else truncated).append(_table(schema, table))
        if deleted:
            with conn.transaction():
                conn.execute("SET LOCAL session_replication_role = replica")  # no trigger,
                # no foreign key: any order, nothing else touched
                for name in deleted:
                    conn.execute(sql.SQL("DELETE FROM {}").format(name))
        if truncated:
            conn.execute(sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(
                sql.SQL(", ").join(truncated)))
        # what ANALYZE learnt of a table outlives TRUNCATE, and the planner would go on
        # using it (its column widths, most common values, ...): gone, as in a fresh clone
        conn.execute(
            "DELETE FROM pg_statistic s USING pg_class c, pg_namespace n"
            " WHERE s.starelid = c.oid AND n.oid = c.relnamespace"
            f" AND {_USER_NAMESPACE}")
        for schema, sequence in conn.execute(
            "SELECT schemaname, sequencename FROM pg_sequences WHERE last_value IS NOT NULL"
        ).fetchall():
            conn.execute(sql.SQL("ALTER SEQUENCE {} RESTART").format(_table(schema, sequence)))


def _rename_when_free(
    admin: psycopg.Connection[Any], name: str, new: str, *, timeout: float = 10.0
) -> None:
    """``ALTER DATABASE name RENAME TO new``, ending every connection to it first (again,
    while one left behind keeps reconnecting)."""
    query = sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
        sql.Identifier(name), sql.Identifier(new)
    )
    deadline = time.monotonic() + timeout
    while True:
        admin.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
        try:
            admin.execute(query)
            return
        except pg_errors.ObjectInUse:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.02)
