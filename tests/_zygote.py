"""A pre-imported fork launcher ("zygote") for the ``veracity`` processes the tests start.

The tests start hundreds of ``veracity`` processes (CLI commands, servers, workers), and
each spends most of its CPU importing Veracity and its libraries. Here each pytest process
starts, on its first such process, one zygote: this file run by the tests' interpreter
(``sys.executable``), which imports once what a ``veracity`` process imports and then
forks, for each process a test asks for, a child that becomes that process. Each child is a
real, separate OS process with its own pid, which the test signals (``os.kill`` on
``Popen.pid``) and whose exit status it reads through ``Popen`` exactly as before.

The client side (``install``, called by tests/conftest.py) replaces ``subprocess.Popen``
with ``ZygotePopen`` (and ``subprocess.run`` and asyncio's subprocesses use it): a ``Popen``
whose program is this virtualenv's ``veracity`` script (however the test names it) is forked
by the zygote, and ``os.waitpid`` answers for its pid too (asyncio's child watchers wait
with it); anything else (``pg_dump``, ``bash``,
``sys.executable -c``), and any call using what the zygote cannot reproduce (``preexec_fn``,
``pass_fds``, ``close_fds=False``, ``user=``, an environment that changes how an
interpreter starts: ``LD_PRELOAD``, ``PYTHONHASHSEED``, the locale, ...), execs as before.
``VERACITY_TEST_EXEC=1`` execs every process; a test marked ``real_exec`` execs its own.

The zygote (``serve``) is single-threaded: a selectors loop on its control socket (the
requests, with the child's stdin, stdout and stderr passed as file descriptors), on the
pipe the ``SIGCHLD`` handler wakes (``signal.set_wakeup_fd``), and on one socket per child
(the answers: its pid, then its wait status). A child exits like a fresh interpreter: the
loop returns the request to the top level of this file, which sets the process up as
``exec`` would have (signal handlers, session, stdio, environment, cwd, umask, sys.path,
sys.argv) and runs the script with ``runpy``; ``SystemExit`` then ends the interpreter
normally (atexit handlers, thread joins, flushed stdio). The zygote notices an exit with
``waitid(..., WNOWAIT)`` and reaps the child only once the client has read its status, so a
child a test has not waited for stays a zombie, whose pid no other process can take, as
with a real exec.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import importlib
import inspect
import io
import json
import os
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

OPT_OUT = "VERACITY_TEST_EXEC"
"""Set to ``1``: every process the tests start execs (no zygote)."""
TRACE = "VERACITY_ZYGOTE_TRACE"
"""A file: each ``veracity`` process the tests start adds a line, forked or exec'd (why)."""

PRELOAD = (
    # what `veracity server`, `worker`, `migrate`, `list` (both backends) and the other
    # commands import (python -X importtime; sys.modules at their exit), tests.* excepted
    "veracity.cli.main",
    "veracity.server",
    "veracity.worker.main",
    "veracity.worker.replayer",
    "veracity._logging",
    "veracity.store.postgres.store",
    "veracity.store.sqlite.store",
    "veracity.maintenance.retention",
    "veracity.adapters.config",
    "veracity.adapters.n8n",
    "veracity.bindings",
    "veracity.runtime",
    "veracity.telemetry",
    "psycopg",
    "psycopg_pool",
    "sqlite3",
    "zoneinfo",
    "httpx",
    "uvloop",
    "uvicorn.lifespan.on",
    "uvicorn.loops.auto",
    "uvicorn.protocols.http.auto",
    "uvicorn.protocols.websockets.auto",
    "pydantic.v1",
)

HANDLED = frozenset({"PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE"})
"""Variables an interpreter reads as it starts that a child applies itself."""

RECV_SIZE = 1 << 20
"""The largest request (its environment) the zygote reads."""


def startup_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of *env* that change how an interpreter starts, or what the preloaded
    modules read as they load, and that a forked child cannot apply (locale, preloaded
    libraries, hash seed, psycopg's implementation, ...). An empty value is unset."""
    return {k: v for k, v in env.items() if v and k not in HANDLED and (
        k.startswith(("PYTHON", "LD_", "FAKETIME", "MALLOC_", "GLIBC_", "PSYCOPG_",
                      "PROMETHEUS_"))
        or k in ("LC_ALL", "LC_CTYPE", "LANG"))}


# -- the zygote ------------------------------------------------------------------------------

class _Child:
    __slots__ = ("exited", "orphan", "reply")

    def __init__(self, reply: socket.socket) -> None:
        self.reply = reply
        self.exited = False  # its status was sent; it stays a zombie until "reap"
        self.orphan = False  # the client closed its socket: reap it as soon as it exits


class _Become:
    """What a forked child runs (returned out of ``serve`` to the top level)."""

    def __init__(self, request: dict[str, Any], fds: list[int], reply: socket.socket) -> None:
        self.request = request
        self.fds = fds
        self.reply = reply


def _send(sock: socket.socket, message: dict[str, Any]) -> bool:
    try:
        sock.send(json.dumps(message).encode())
    except OSError:
        return False
    return True


def _fds() -> list[int]:
    return sorted(int(name) for name in os.listdir("/proc/self/fd"))


def _status(result: os.waitid_result) -> int:
    """The raw wait status (as ``waitpid`` gives it) of a ``waitid`` result."""
    if result.si_code == os.CLD_EXITED:
        return (result.si_status & 0xFF) << 8
    if result.si_code == os.CLD_DUMPED:
        return result.si_status | 0x80
    return result.si_status  # CLD_KILLED


def serve(control: socket.socket) -> _Become | None:
    """The zygote's loop: fork a child per request on *control*; ``None`` when the client
    has gone (its end of *control* closed), a ``_Become`` in a child."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    children: dict[int, _Child] = {}
    replies: dict[socket.socket, int] = {}
    sel = selectors.DefaultSelector()
    sel.register(control, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)

    def reap(pid: int) -> None:
        child = children.pop(pid)
        os.waitpid(pid, 0)
        replies.pop(child.reply, None)
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(child.reply)
        child.reply.close()

    def check_exits() -> None:
        for pid, child in list(children.items()):
            if child.exited:
                continue
            result = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if result is None:
                continue
            child.exited = True
            if child.orphan or not _send(child.reply, {"status": _status(result)}):
                reap(pid)

    while True:
        for key, _ in sel.select():
            if key.fileobj is control:
                try:
                    message, fds, flags, _ = socket.recv_fds(control, RECV_SIZE, 4)
                except ConnectionResetError:
                    message, fds, flags = b"", [], 0
                if not message:
                    for fd in fds:
                        os.close(fd)
                    return None  # the client has gone: the children live on, as orphans
                if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) != 4:
                    for fd in fds:
                        os.close(fd)
                    raise RuntimeError(f"bad request ({len(message)} bytes, {len(fds)} fds)")
                reply = socket.socket(fileno=fds[3])
                sys.stdout.flush()
                sys.stderr.flush()
                try:
                    pid = os.fork()
                except OSError as exc:
                    _send(reply, {"fork_error": exc.errno, "message": str(exc)})
                    reply.close()
                    for fd in fds[:3]:
                        os.close(fd)
                    continue
                if pid == 0:
                    # the child: nothing of the zygote's may outlive this (its sockets, the
                    # selector, the wakeup pipe, the other children's sockets)
                    signal.set_wakeup_fd(-1)
                    sel.close()
                    control.close()
                    os.close(wake_r)
                    os.close(wake_w)
                    for other in children.values():
                        other.reply.close()
                    return _Become(json.loads(message), fds[:3], reply)
                for fd in fds[:3]:
                    os.close(fd)
                children[pid] = _Child(reply)
                replies[reply] = pid
                sel.register(reply, selectors.EVENT_READ)
                _send(reply, {"pid": pid})
            elif key.fileobj == wake_r:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 512):
                        pass
                check_exits()
            else:
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock not in replies:
                    continue  # reaped (and closed) earlier in this round
                pid = replies[sock]
                try:
                    data = sock.recv(64)
                except OSError:
                    data = b""
                child = children[pid]
                if child.exited:
                    reap(pid)  # "reap" (the client has the status), or the client has gone
                elif not data:
                    child.orphan = True
                    replies.pop(sock)
                    sel.unregister(sock)


# -- a child becomes the process the client asked for --------------------------------------

def _stdio(fd: int, write: bool, buffered: bool, like: io.TextIOWrapper | None) -> Any:
    """``sys.stdin``/``stdout``/``stderr`` on *fd* as an interpreter creates them at start
    (CPython's ``create_stdio``): line-buffered on a terminal (stderr always), unbuffered
    with ``PYTHONUNBUFFERED``; encoding and errors as the zygote's (same locale)."""
    try:
        os.fstat(fd)
    except OSError:
        return None
    buffering = -1 if buffered or not write else 0
    buf: Any = open(fd, "wb" if write else "rb", buffering=buffering, closefd=False)
    raw = buf.raw if buffering else buf
    raw.name = ("<stdin>", "<stdout>", "<stderr>")[fd]
    line_buffering = buffered and (raw.isatty() or fd == 2)
    text = io.TextIOWrapper(
        buf, encoding=like.encoding if like else None, errors=like.errors if like else None,
        newline="\n", line_buffering=line_buffering, write_through=not buffered)
    text.mode = "w" if write else "r"  # type: ignore[misc]
    return text


def become(child: _Become, fresh_signals: Mapping[int, Any], base_path: list[str],
           stdio: tuple[Any, Any, Any]) -> str:
    """Set this forked child up as an ``exec`` of the request would have; the script to
    run. On failure the client hears why (and raises it) and the child exits."""
    request, reply = child.request, child.reply
    try:
        for signum, handler in fresh_signals.items():
            with contextlib.suppress(OSError, ValueError):
                signal.signal(signum, handler)
        if request["setsid"]:
            os.setsid()
        if request["pgid"] >= 0:
            os.setpgid(0, request["pgid"])
        for target, fd in enumerate(child.fds):
            os.dup2(fd, target)
        for fd in child.fds:
            if fd > 2:
                os.close(fd)
        keep = {0, 1, 2, reply.fileno()}
        for fd in _fds():  # nothing else of the zygote's is open
            if fd not in keep:
                with contextlib.suppress(OSError):
                    os.close(fd)
        env: dict[str, str] = request["env"]
        os.environ.clear()
        os.environ.update(env)
        import time

        time.tzset()
        os.chdir(request["cwd"])
        if request["umask"] >= 0:
            os.umask(request["umask"])
        script: str = request["argv"][0]
        # sys.path as an interpreter computes it: the script's folder, PYTHONPATH, the rest
        first = [os.path.dirname(os.path.realpath(script))]
        first += [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = list(dict.fromkeys([*first, *base_path]))
        importlib.invalidate_caches()
        sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
        sys.argv[:] = list(request["argv"])
        sys.orig_argv[:] = [sys.executable, *request["argv"]]
        buffered = not env.get("PYTHONUNBUFFERED")
        for name, fd in (("stdin", 0), ("stdout", 1), ("stderr", 2)):
            stream = _stdio(fd, fd > 0, buffered, stdio[fd])
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)
    except BaseException as exc:  # the client raises it, as Popen raises a failed exec's
        _send(reply, {"error": getattr(exc, "errno", None) or errno.EINVAL,
                      "message": f"the zygote's child could not start: {exc!r}"})
        os._exit(127)
    _send(reply, {"ready": os.getpid()})
    reply.close()
    return script


def _main() -> None:
    fresh: dict[int, Any] = {}  # the signal handlers of a fresh interpreter: this one, now
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):
            handler = signal.getsignal(signum)
            if handler is not None:
                fresh[signum] = handler
    here = os.path.dirname(os.path.realpath(__file__))
    sys.path[:] = [p for p in sys.path if p != here]  # tests/ is not on a veracity's path
    base_path = list(sys.path)
    stdio = (sys.stdin, sys.stdout, sys.stderr)
    control = socket.socket(fileno=int(sys.argv[1]))
    import veracity.cli

    entry = veracity.cli.main  # the function the script imports, which the module hides:
    for name in PRELOAD:  # importing veracity.cli.main binds the module to that name
        importlib.import_module(name)
    from veracity.cli.main import _load

    _load()
    veracity.cli.main = entry  # as before `main()` ran
    assert threading.active_count() == 1, threading.enumerate()  # fork from one thread
    open_fds = [fd for fd in _fds() if _usable(fd)]  # (listdir's own is closed by now)
    assert open_fds == sorted([0, 1, 2, control.fileno()]), [
        (fd, os.readlink(f"/proc/self/fd/{fd}")) for fd in open_fds]
    # the children would otherwise write to (so copy) nearly every page of these modules
    # when their final collection visits the objects; frozen, a child's exit costs a
    # quarter of what it did (a fresh process has no copies to make, but imports)
    gc.collect()
    gc.freeze()
    control.send(b"ready")
    child = serve(control)
    if child is None:
        return
    script = become(child, fresh, base_path, stdio)
    del child
    import runpy

    runpy.run_path(script, run_name="__main__")


# -- the client ------------------------------------------------------------------------------

def _veracity_script() -> str | None:
    """This virtualenv's ``veracity`` script (resolved), if its interpreter is this one."""
    found = shutil.which("veracity", path=os.path.dirname(sys.executable))
    if found is None:
        return None
    with open(found, "rb") as f:
        first = f.readline()
    if not first.startswith(b"#!"):
        return None
    interpreter = first[2:].strip().split()[0].decode()
    if os.path.realpath(interpreter) != os.path.realpath(sys.executable):
        return None
    return os.path.realpath(found)


class _Zygote:
    """This pytest process's zygote: started on first use, ended by ``stop``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.control: socket.socket | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.owner = 0
        self.baseline: dict[str, str] = {}
        self.log = ""

    def _start(self) -> socket.socket:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        fd, self.log = tempfile.mkstemp(prefix="veracity-zygote-", suffix=".log")
        try:
            self.proc = _REAL_POPEN(
                [sys.executable, os.path.abspath(__file__), str(theirs.fileno())],
                pass_fds=[theirs.fileno()], env=env, cwd="/", stdin=subprocess.DEVNULL,
                stdout=fd, stderr=fd)
        finally:
            os.close(fd)
            theirs.close()
        self.baseline = startup_env(env)
        if mine.recv(64) != b"ready":
            self.proc.wait()
            raise RuntimeError(f"the tests' zygote did not start:\n{self._said()}")
        self.owner = os.getpid()
        self.control = mine
        return mine

    def _said(self) -> str:
        with contextlib.suppress(OSError), open(self.log, errors="replace") as f:
            return f.read()[-3000:]
        return ""

    def launch(self, request: dict[str, Any], fds: tuple[int, int, int]) -> _Handle | str:
        """Have the zygote fork the process of *request* (stdin, stdout, stderr: *fds*); or
        why the caller should exec it instead (its environment would start an interpreter
        otherwise than the zygote's; its arguments do not fit in one message)."""
        reply, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with reply:
            try:
                with self.lock:
                    if self.control is None or self.owner != os.getpid():
                        self._start()
                    assert self.control is not None
                    if startup_env(request["env"]) != self.baseline:
                        return "environment"
                    try:
                        socket.send_fds(self.control, [json.dumps(request).encode()],
                                        [*fds, theirs.fileno()])
                    except OSError as exc:
                        if exc.errno == errno.EMSGSIZE:
                            return "arguments over a message's size"
                        raise
            finally:
                theirs.close()
            # the zygote says the pid; the child that it is set up (the exec succeeded, as
            # it were) or why not, in either order; or, after the pid, the zygote the
            # child's exit status (it died before it was set up)
            pid: int | None = None
            told: dict[str, Any] | None = None
            while pid is None or told is None:
                message = _recv(reply)
                if message is None:
                    raise RuntimeError(f"the tests' zygote has gone:\n{self._said()}")
                if "fork_error" in message:
                    raise OSError(message["fork_error"], message["message"])
                if "pid" in message:
                    pid = int(message["pid"])
                else:
                    told = message
            if "error" in told:
                raise OSError(told["error"], told["message"])  # closing reply reaps it
            handle = _Handle(reply.detach(), pid)
        if "status" in told:
            handle.status = int(told["status"])
            handle.reap()
        return handle

    def stop(self) -> None:
        with self.lock:
            if self.control is not None and self.owner == os.getpid():
                self.control.close()
                assert self.proc is not None
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
                if self.proc.returncode == 0:
                    with contextlib.suppress(OSError):
                        os.unlink(self.log)
            self.control = None
            self.proc = None


def _recv(sock: socket.socket, flags: int = 0) -> dict[str, Any] | None:
    data = sock.recv(4096, flags)
    if not data:
        return None
    message: dict[str, Any] = json.loads(data)
    return message


class _Handle:
    """A child of the zygote, as its client sees it (its wait status, when it has one)."""

    def __init__(self, fd: int, pid: int) -> None:
        self.sock = socket.socket(fileno=fd)
        self.pid = pid
        self.status: int | None = None
        self.lock = threading.Lock()

    def waitpid(self, flags: int) -> tuple[int, int]:
        """``os.waitpid(pid, flags)`` for this child (``WNOHANG`` or 0)."""
        while True:
            with self.lock:
                if self.status is not None:
                    return (self.pid, self.status)
                try:
                    message = _recv(self.sock, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    pass
                else:
                    if message is None:
                        raise RuntimeError(f"the tests' zygote ended before child {self.pid}")
                    self.status = int(message["status"])
                    self.reap()
                    continue
            if flags & os.WNOHANG:
                return (0, 0)
            poll = select.poll()  # until its status comes (or the zygote ends)
            poll.register(self.sock, select.POLLIN)
            poll.poll()

    def reap(self) -> None:
        """Tell the zygote the status is read: it reaps the zombie (as it does when the
        socket closes)."""
        with contextlib.suppress(OSError):
            self.sock.send(b"reap", socket.MSG_DONTWAIT)
        self.sock.close()

    def close(self) -> None:
        self.sock.close()

    def __del__(self) -> None:  # a Popen never waited for: the zygote reaps it at its exit
        self.sock.close()


_REAL_POPEN = subprocess.Popen
_REAL_WAITPID = os.waitpid
_HANDLES: weakref.WeakValueDictionary[int, _Handle] = weakref.WeakValueDictionary()
"""The zygote's children of this process's live Popen objects, by pid."""


def _waitpid(pid: int, options: int) -> tuple[int, int]:
    """``os.waitpid``, which also waits for the zygote's children: asyncio's child
    watchers wait for the pid of the Popen they started with it."""
    handle = _HANDLES.get(pid)
    if handle is None:
        return _REAL_WAITPID(pid, options)
    return handle.waitpid(options)
_ZYGOTE = _Zygote()
_SCRIPT: str | None = None
_EXECUTE_CHILD = inspect.signature(_REAL_POPEN._execute_child)  # type: ignore[attr-defined]
REAL_EXEC = threading.Event()
"""Set while a test marked ``real_exec`` runs: its processes exec."""


@contextlib.contextmanager
def real_exec() -> Iterator[None]:
    """Every process started meanwhile execs."""
    REAL_EXEC.set()
    try:
        yield
    finally:
        REAL_EXEC.clear()


def _umask() -> int:
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return -1


def _exec_path(argv0: str, env: Mapping[str, str] | None, cwd: str) -> str | None:
    """The file an exec of *argv0* runs (as Popen looks it up), or None."""
    if os.path.dirname(argv0):
        return argv0
    for folder in os.get_exec_path(env):
        path = os.path.join(cwd, folder, argv0)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return os.path.join(folder, argv0)
    return None


def _request(a: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The zygote request for a Popen (the arguments of ``_execute_child``), or None and
    why it execs (``""``: it does not run this virtualenv's ``veracity``)."""
    args = a["args"]
    if _SCRIPT is None or a["shell"] or isinstance(args, (str, bytes, os.PathLike)):
        return None, ""
    argv = [os.fsdecode(x) for x in args]
    cwd = os.path.abspath(os.fsdecode(a["cwd"])) if a["cwd"] is not None else os.getcwd()
    given = a["env"]
    env = (dict(os.environ) if given is None
           else {os.fsdecode(k): os.fsdecode(v) for k, v in given.items()})
    path = _exec_path(argv[0], env if given is not None else None, cwd) if argv else None
    if path is None or os.path.realpath(os.path.join(cwd, path)) != _SCRIPT:
        return None, ""
    for why, used in (
        ("marked real_exec", REAL_EXEC.is_set()),
        ("executable=", a["executable"] is not None),
        ("preexec_fn=", a["preexec_fn"] is not None),
        ("pass_fds=", bool(a["pass_fds"])),
        ("close_fds=False", not a["close_fds"]),
        ("restore_signals=False", not a["restore_signals"]),
        ("umask=", a.get("umask", -1) >= 0),
        ("user=/group=", any(a.get(k) is not None for k in ("gid", "gids", "uid"))),
        ("no such cwd", not os.path.isdir(cwd)),  # Popen's own exec raises the error
    ):
        if used:
            return None, why
    pgid = a.get("process_group")
    return {"argv": [path, *argv[1:]], "env": env, "cwd": cwd, "umask": _umask(),
            "setsid": bool(a["start_new_session"]),
            "pgid": -1 if pgid is None else pgid}, ""


def _trace(how: str, argv: list[str]) -> None:
    """With ``VERACITY_ZYGOTE_TRACE=FILE``: a line per ``veracity`` process, forked or
    exec'd and why (appended to FILE; to count what the zygote does)."""
    path = os.environ.get(TRACE)
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {how} | {' '.join(argv[1:3])}\n")


def _usable(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


class ZygotePopen(subprocess.Popen[Any]):
    """``subprocess.Popen`` that has the tests' zygote fork a ``veracity`` process."""

    _zygote: _Handle | None = None

    def _execute_child(self, *args: Any, **kwargs: Any) -> None:
        a = _EXECUTE_CHILD.bind(self, *args, **kwargs).arguments
        request, why = _request(a)
        fds = tuple(a[k] if a[k] != -1 else i
                    for i, k in enumerate(("p2cread", "c2pwrite", "errwrite")))
        if request is not None and not all(_usable(fd) for fd in fds):
            request, why = None, "a closed stdin, stdout or stderr"
        launched = None if request is None else _ZYGOTE.launch(request, fds)  # type: ignore[arg-type]
        handle = launched if isinstance(launched, _Handle) else None
        if isinstance(launched, str):
            why = launched
        if why:
            _trace(f"exec ({why})", [os.fsdecode(x) for x in a["args"]])
        if request is None or handle is None:
            super()._execute_child(*args, **kwargs)  # type: ignore[misc]
            return
        _trace("fork", request["argv"])
        sys.audit("subprocess.Popen", request["argv"][0], a["args"], a["cwd"], a["env"])
        self._close_pipe_fds(a["p2cread"], a["p2cwrite"], a["c2pread"],  # type: ignore[attr-defined]
                             a["c2pwrite"], a["errread"], a["errwrite"])
        self._zygote = handle
        self.pid = handle.pid
        _HANDLES[handle.pid] = handle
        self._child_created = True
        if handle.status is not None:
            with self._waitpid_lock:  # type: ignore[attr-defined]
                self._handle_exitstatus(handle.status)  # type: ignore[attr-defined]

    def _try_wait(self, wait_flags: int) -> tuple[int, int]:
        if self._zygote is None:
            return super()._try_wait(wait_flags)  # type: ignore[misc, no-any-return]
        return self._zygote.waitpid(wait_flags)

    def _internal_poll(self, _deadstate: int | None = None, **kwargs: Any) -> int | None:
        handle = self._zygote
        if handle is None:
            return super()._internal_poll(_deadstate, **kwargs)  # type: ignore[misc, no-any-return]
        if self.returncode is None:
            if not self._waitpid_lock.acquire(False):  # type: ignore[attr-defined]
                return None
            try:
                if self.returncode is None:
                    pid, sts = handle.waitpid(os.WNOHANG)
                    if pid == self.pid:
                        self._handle_exitstatus(sts)  # type: ignore[attr-defined]
            except Exception:
                if _deadstate is not None:
                    self.returncode = _deadstate
                else:
                    raise
            finally:
                self._waitpid_lock.release()  # type: ignore[attr-defined]
        return self.returncode


def install() -> None:
    """Route this process's ``veracity`` processes to a zygote (unless opted out)."""
    global _SCRIPT
    if os.environ.get(OPT_OUT) == "1":
        return
    _SCRIPT = _veracity_script()
    if _SCRIPT is not None:
        subprocess.Popen = ZygotePopen  # type: ignore[misc]
        os.waitpid = _waitpid


def uninstall() -> None:
    """Exec again, and end the zygote (its children live on, as a real exec's would)."""
    subprocess.Popen = _REAL_POPEN  # type: ignore[misc]
    os.waitpid = _REAL_WAITPID
    _ZYGOTE.stop()


if __name__ == "__main__":
    _main()
