"""The ASGI app serving a :class:`FakeN8n` (:func:`create_app`): n8n's routes (webhooks, the
public executions API, login and the internal stop), the ``/_fake`` control API, and, for as
long as it is served, the ticker that advances runs and the sender of callbacks.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import secrets
from collections.abc import AsyncIterator, Mapping
from http import HTTPStatus
from typing import Any, cast

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from veracity._tls import ssl_context
from veracity.testing.fake_n8n.dates import iso, parse_iso
from veracity.testing.fake_n8n.engine import IN_MEMORY, FakeN8n, _CallbackJob, _webhook_key
from veracity.testing.fake_n8n.scripts import _OUTCOMES, WAIT_INDEFINITELY, Outcome, Script
from veracity.testing.fake_n8n.truth import CallbackAttempt

LIST_STATUS_FILTER = ("canceled", "error", "running", "success", "waiting")
AUTH_COOKIE = "n8n-auth"


class _Runtime:
    """What exists only while the app is served: the loop, the hang latch, the ticker and the
    callback sender."""

    def __init__(self, fake: FakeN8n) -> None:
        self.fake = fake
        self.loop = asyncio.get_running_loop()
        self.released = asyncio.Event()
        self.client = httpx.AsyncClient(timeout=fake.callback_timeout, verify=ssl_context())
        self.tasks: set[asyncio.Task[None]] = set()
        self.ticker = asyncio.create_task(self._tick())

    def release_threadsafe(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop may be closed already
            self.loop.call_soon_threadsafe(self.released.set)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.fake.tick)
            self.fake.advance()
            self.flush()

    def flush(self) -> None:
        for job in self.fake._drain_callbacks():
            task = asyncio.create_task(self._send(job))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _send(self, job: _CallbackJob) -> None:
        for attempt in range(1, job.times + 1):
            status: int | None = None
            error: str | None = None
            try:
                response = await self.client.post(
                    job.url, json=job.body, headers={"Authorization": f"Bearer {job.token}"}
                )
                status = response.status_code
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
            self.fake._record_callback(
                CallbackAttempt(
                    run_id=job.run_id,
                    execution_id=job.execution_id,
                    kind=job.kind,
                    url=job.url,
                    body=job.body,
                    attempt=attempt,
                    at=self.fake.now(),
                    status_code=status,
                    error=error,
                )
            )

    async def hang(self, seconds: float | None) -> bool:
        """Wait ``seconds`` (None: forever). True if released early (shutting down)."""
        if seconds is None:
            await self.released.wait()
            return True
        try:
            await asyncio.wait_for(self.released.wait(), timeout=seconds)
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        self.released.set()
        self.ticker.cancel()
        tasks = [self.ticker, *self.tasks]
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.client.aclose()


def _json(status: int, body: Any, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=headers)


_DOWN = {"code": 503, "message": "n8n is down (fake n8n: simulated restart)"}
STARTING_UP_TEXT = "n8n is starting up. Please wait"
"""n8n's answer to every route but /healthz while its database migrations run."""


def express_not_found(request: Request) -> Response:
    """Express's default 404 (its final handler) for a route nothing is mounted on: the HTML
    page ``Cannot <METHOD> <path>``, what n8n answers while it starts."""
    raw = request.scope.get("raw_path")
    path = raw.decode("latin-1") if isinstance(raw, bytes) else request.url.path
    path = path.split("?", 1)[0]
    message = _escape_html(f"Cannot {request.method} {path}")
    page = (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>Error</title>\n</head>\n<body>\n<pre>{message}</pre>\n</body>\n</html>\n"
    )
    headers = {"Content-Security-Policy": "default-src 'none'", "X-Content-Type-Options": "nosniff"}
    return Response(page, status_code=404, media_type="text/html", headers=headers)


def _escape_html(text: str) -> str:
    for char, entity in (
        ("&", "&amp;"),
        ("<", "&lt;"),
        (">", "&gt;"),
        ('"', "&quot;"),
        ("'", "&#39;"),
    ):
        text = text.replace(char, entity)
    return text.replace("\n", "<br>").replace("  ", " &nbsp;")


_NUMERIC = re.compile(r"^\d+$")


class _App:
    def __init__(self, fake: FakeN8n) -> None:
        self.fake = fake

    # -- plumbing -----------------------------------------------------------------------------

    def runtime(self) -> _Runtime | None:
        return self.fake._runtime

    async def hang(self, seconds: float | None) -> bool:
        runtime = self.runtime()
        if runtime is None:  # not served through the lifespan: just wait
            await asyncio.sleep(seconds if seconds is not None else 3600.0)
            return False
        return await runtime.hang(seconds)

    async def enter(self, request: Request) -> Response | None:
        """Latency first, then the engine's availability: down, migrating, or up without its
        routes (``/healthz`` is not gated: n8n registers it before it migrates)."""
        if self.fake.latency > 0:
            await asyncio.sleep(self.fake.latency)
        phase = self.fake.phase()
        if phase == "down":
            return _json(503, _DOWN)
        if phase == "migrating":
            # n8n's gate: Express's res.send of a string, 200 text/html.
            return PlainTextResponse(STARTING_UP_TEXT, media_type="text/html")
        if phase == "starting":
            return express_not_found(request)
        return None

    def api_key_error(self, request: Request) -> Response | None:
        key = request.headers.get("x-n8n-api-key")
        if key is None:
            return _json(401, {"message": "'X-N8N-API-KEY' header required"})
        if not secrets.compare_digest(key.encode(), self.fake.api_key.encode()):
            return _json(401, {"message": "unauthorized"})
        return None

    def flush(self) -> None:
        runtime = self.runtime()
        if runtime is not None:
            runtime.flush()

    # -- engine endpoints ---------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        if self.fake.latency > 0:
            await asyncio.sleep(self.fake.latency)
        if self.fake.down:
            return _json(503, _DOWN)
        return _json(200, {"status": "ok"})

    async def webhook(self, request: Request) -> Response:
        early = await self.enter(request)
        if early is not None:
            return early
        path = request.path_params["path"]
        test = request.url.path.startswith("/webhook-test/")
        method = request.method
        try:
            key = _webhook_key(path)
            registered = key in self.fake._webhooks
        except ValueError:
            registered = False
        if not registered:
            hint = (
                "Click the 'Execute workflow' button on the canvas, then try again. (In test "
                "mode, the webhook only works for one call after you click this button)"
                if test
                else "The workflow must be active for a production URL to run successfully. You "
                "can activate the workflow using the toggle in the top-right of the editor. Note "
                "that unlike test URL calls, production URL calls aren't shown on the canvas "
                "(only in the executions list)"
            )
            return _json(
                404,
                {
                    "code": 404,
                    "message": f'The requested webhook "{method} {path}" is not registered.',
                    "hint": hint,
                },
            )
        if method != "POST":
            return _json(
                404,
                {
                    "code": 404,
                    "message": f"This webhook is not registered for {method} requests. "
                    "Did you mean to make a POST request?",
                },
            )
        raw = await request.body()
        body: Any
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = raw.decode("utf-8", "replace")
        run_id, script = self.fake.trigger(path, body)
        self.flush()
        if run_id is None:
            if isinstance(script.refuse_body, str):
                return PlainTextResponse(script.refuse_body, status_code=script.refuse_status)
            return _json(script.refuse_status, script.refuse_body)
        if script.respond == "hang":
            if await self.hang(None):
                return _json(503, {"code": 503, "message": "fake n8n shutting down"})
        elif script.respond_delay > 0:
            await self.hang(script.respond_delay)
        if script.respond == "default":
            return _json(200, {"message": "Workflow was started"})
        return _json(200, {"executionId": run_id})

    async def webhook_waiting(self, request: Request) -> Response:
        early = await self.enter(request)
        if early is not None:
            return early
        run_id = request.path_params["id"]
        execution = self.fake.execution(run_id)
        if execution is None:
            return _json(404, {"code": 404, "message": f'The execution "{run_id}" does not exist.'})
        if execution["status"] not in IN_MEMORY:
            return _json(
                409, {"code": 409, "message": f'The execution "{run_id}" has finished already.'}
            )
        if execution["status"] != "waiting" or execution["waitTill"] != iso(WAIT_INDEFINITELY):
            message = f"fake n8n: execution {run_id} is not waiting for a webhook"
            return _json(409, {"code": 409, "message": message})
        try:
            self.fake.resume(run_id)
        except ValueError as exc:
            return _json(409, {"code": 409, "message": str(exc)})
        return _json(200, {})

    async def get_execution(self, request: Request) -> Response:
        early = await self.enter(request)
        if early is not None:
            return early
        denied = self.api_key_error(request)
        if denied is not None:
            return denied
        run_id = request.path_params["id"]
        if not _NUMERIC.match(run_id):
            return _json(400, {"message": "request/params/id must be number"})
        include = request.query_params.get("includeData", "false").lower() == "true"
        controls = self.fake._controls(run_id)
        if controls is not None and self.fake.execution(run_id) is not None:
            if controls.get_hang:
                await self.hang(None)
                return _json(503, {"code": 503, "message": "fake n8n shutting down"})
            if controls.get_delay > 0:
                await self.hang(controls.get_delay)
            if controls.get_error is not None:
                phrase = _phrase(controls.get_error)
                return _json(controls.get_error, {"code": controls.get_error, "message": phrase})
            if controls.get_raw_body is not None:
                return Response(controls.get_raw_body, media_type="application/json")
        execution = self.fake.execution(run_id, include_data=include)
        self.flush()
        if execution is None:
            return _json(404, {"message": "Not Found"})
        if controls is not None and controls.report_status is not None:
            execution["status"] = controls.report_status
        return _json(200, execution)

    async def list_executions(self, request: Request) -> Response:
        early = await self.enter(request)
        if early is not None:
            return early
        denied = self.api_key_error(request)
        if denied is not None:
            return denied
        q = request.query_params
        status = q.get("status")
        if status is not None and status not in LIST_STATUS_FILTER:
            allowed = ", ".join(LIST_STATUS_FILTER)
            return _json(
                400,
                {
                    "message": "request/query/status must be equal to one of the allowed "
                    f"values: {allowed}"
                },
            )
        try:
            limit = int(q.get("limit", "100"))
        except ValueError:
            return _json(400, {"message": "request/query/limit must be number"})
        if limit > 250:
            return _json(400, {"message": "request/query/limit must be <= 250"})
        if limit < 1:
            return _json(400, {"message": "request/query/limit must be >= 1"})
        last_id: int | None = None
        cursor = q.get("cursor")
        if cursor:
            try:
                decoded = json.loads(base64.b64decode(cursor))
                last_id = int(decoded["lastId"])
                limit = int(decoded.get("limit", limit))
            except (ValueError, KeyError, TypeError):
                return _json(400, {"message": "An invalid cursor was provided"})
        include = q.get("includeData", "false").lower() == "true"
        page, more_after = self.fake.list_executions(
            status=status,
            workflow_id=q.get("workflowId"),
            limit=limit,
            last_id=last_id,
            include_data=include,
        )
        next_cursor = None
        if more_after is not None:
            next_cursor = base64.b64encode(
                json.dumps({"lastId": str(more_after), "limit": limit}).encode()
            ).decode()
        return _json(200, {"data": page, "nextCursor": next_cursor})

    async def public_stop(self, request: Request) -> Response:
        early = await self.enter(request)
        if early is not None:
            return early
        if not self.fake.has_public_stop:
            # n8n 1.x: no such route; the API router answers before checking the key.
            return _json(404, {"message": "not found"})
        denied = self.api_key_error(request)
        if denied is not None:
            return denied
        run_id = request.path_params["id"]
        if not _NUMERIC.match(run_id):
            return _json(400, {"message": "request/params/id must be number"})
        answer = self.fake.stop(run_id, via="public")
        self.flush()
        if answer.kind == "ok":
            return _json(200, answer.run)
        if answer.kind == "unknown":
            return _json(404, {"message": "Not Found"})
        return _json(500, {"message": answer.message})

    async def rest_login(self, request: Request) -> Response:
        early = await self.enter(request)
        if early is not None:
            return early
        try:
            payload = json.loads(await request.body())
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            return _json(400, {"code": 400, "message": "Request body is not valid JSON"})
        email, password = payload.get("emailOrLdapLoginId"), payload.get("password")
        if not isinstance(email, str) or not isinstance(password, str):
            return _json(
                400, {"code": 400, "message": "emailOrLdapLoginId and password are required"}
            )
        if "@" not in email:
            return _json(400, {"code": 400, "message": "Invalid email address"})
        token = self.fake.login(email, password, request.headers.get("browser-id"))
        if token is None:
            return _json(
                401,
                {"code": 401, "message": "Wrong username or password. Do you have caps lock on?"},
            )
        response = _json(
            200,
            {
                "data": {
                    "id": "00000000-0000-4000-8000-000000000001",
                    "email": self.fake.email,
                    "firstName": "Fake",
                    "lastName": "Owner",
                    "role": "global:owner",
                }
            },
        )
        response.set_cookie(AUTH_COOKIE, token, max_age=7 * 24 * 3600, httponly=True)
        return response

    async def rest_stop(self, request: Request) -> Response:
        early = await self.enter(request)
        if early is not None:
            return early
        token = request.cookies.get(AUTH_COOKIE)
        if not self.fake.session_ok(token, request.headers.get("browser-id")):
            return _json(401, {"status": "error", "message": "Unauthorized"})
        answer = self.fake.stop(request.path_params["id"], via="rest")
        self.flush()
        if answer.kind == "ok":
            return _json(200, {"data": answer.run})
        return _json(500, {"code": 0, "message": answer.message})

    async def api_not_found(self, request: Request) -> Response:
        early = await self.enter(request)
        return early or _json(404, {"message": "not found"})

    # -- control API --------------------------------------------------------------------------

    async def control(self, request: Request) -> Response:
        try:
            return await self._control(request)
        except KeyError as exc:
            return _json(404, {"error": str(exc.args[0]) if exc.args else "not found"})
        except (ValueError, TypeError) as exc:
            return _json(400, {"error": str(exc)})

    async def _control(self, request: Request) -> Response:
        fake = self.fake
        name = request.path_params["name"]
        method = request.method
        raw = await request.body()
        data: Any = json.loads(raw) if raw else {}
        if not isinstance(data, dict):
            raise ValueError("the body is a JSON object")
        parts = name.strip("/").split("/")
        if name == "health" and method == "GET":
            return _json(
                200, {"ok": True, "version": fake.version, "down": fake.down, "phase": fake.phase()}
            )
        if name == "webhooks" and method == "POST":
            script = Script.from_json(_obj(data, "script")) if data.get("script") else None
            path = _str(data, "path")
            workflow_id = fake.add_webhook(path, script, workflow_id=data.get("workflow_id"))
            return _json(200, {"path": _webhook_key(path), "workflowId": workflow_id})
        if name == "webhooks/next" and method == "POST":
            fake.queue_script(_str(data, "path"), Script.from_json(_obj(data, "script")))
            return _json(200, {"queued": True})
        if name == "scripts/by-execution" and method == "POST":
            script = Script.from_json(_obj(data, "script"))
            fake.script_for_execution(_str(data, "execution_id"), script)
            return _json(200, {"ok": True})
        if name == "runs" and method == "GET":
            return _json(200, {"runs": [t.to_json() for t in fake.truths()]})
        if parts[0] == "runs" and len(parts) >= 2:
            run_id = parts[1]
            if len(parts) == 2 and method == "GET":
                return _json(200, fake.truth(run_id).to_json())
            if len(parts) == 2 and method == "PATCH":
                _patch_controls(fake, run_id, data)
                return _json(200, fake.truth(run_id).to_json())
            action = parts[2] if len(parts) == 3 else ""
            if action == "resume" and method == "POST":
                fake.resume(run_id)
            elif action == "finish" and method == "POST":
                outcome = data.get("outcome", "success")
                if outcome not in _OUTCOMES:
                    raise ValueError(f"outcome must be one of {_OUTCOMES}")
                fake.finish(
                    run_id,
                    cast(Outcome, outcome),
                    result=data.get("result"),
                    error=data.get("error", "scripted failure"),
                )
            elif action == "forget" and method == "POST":
                fake.forget(run_id)
            else:
                return _json(404, {"error": f"no control endpoint {method} /_fake/{name}"})
            self.flush()
            return _json(200, fake.truth(run_id).to_json())
        if name in ("kill", "start", "restart") and method == "POST":
            windows = {key: data.get(key, 0.0) for key in ("starting_for", "migrating_for")}
            if name == "kill":
                fake.kill()
            elif name == "start":
                fake.start(**windows)
            else:
                fake.restart(**windows)
            self.flush()
            return _json(200, {"down": fake.down})
        if name == "callbacks" and method == "GET":
            return _json(200, {"callbacks": [c.to_json() for c in fake.callbacks()]})
        if name == "settings" and method == "PATCH":
            if "latency" in data:
                fake.latency = float(data["latency"])
            if "version" in data:
                fake.version = str(data["version"])
            return _json(200, {"latency": fake.latency, "version": fake.version})
        if name == "violations" and method == "POST":
            raw_map = data.get("terminal_at")
            if not isinstance(raw_map, dict):
                raise ValueError("terminal_at is an object of execution id -> ISO time")
            key = data.get("key", "execution_id")
            if key not in ("execution_id", "run_id"):
                raise ValueError("key is execution_id or run_id")
            terminal = {str(k): parse_iso(str(v)) for k, v in raw_map.items()}
            return _json(200, {"violations": fake.truthful_violations(terminal, key=key)})
        return _json(404, {"error": f"no control endpoint {method} /_fake/{name}"})


def _str(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{key} is a string")
    return value


def _obj(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = data.get(key)
    if not isinstance(value, Mapping):
        raise ValueError(f"{key} is a JSON object")
    return value


def _patch_controls(fake: FakeN8n, run_id: str, data: Mapping[str, Any]) -> None:
    allowed = {
        "callback",
        "ignore_stops",
        "stop_failures",
        "get_error",
        "get_delay",
        "get_hang",
        "get_raw_body",
        "report_status",
    }
    unknown = set(data) - allowed
    if unknown:
        raise ValueError(f"unknown run controls: {sorted(unknown)}")
    fake.control(
        run_id,
        callback=data.get("callback"),
        ignore_stops=data.get("ignore_stops"),
        stop_failures=data.get("stop_failures"),
        get_error=data["get_error"] if "get_error" in data else False,
        get_delay=data.get("get_delay"),
        get_hang=data.get("get_hang"),
        get_raw_body=data["get_raw_body"] if "get_raw_body" in data else False,
        report_status=data["report_status"] if "report_status" in data else False,
    )


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def create_app(fake: FakeN8n) -> Starlette:
    """The ASGI app serving ``fake``. Its lifespan runs the ticker and the callback sender."""
    app = _App(fake)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        runtime = _Runtime(fake)
        fake._attach(runtime)
        try:
            yield
        finally:
            fake._detach(runtime)
            await runtime.close()

    webhook_methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"]
    routes = [
        Route("/healthz", app.healthz, methods=["GET"]),
        Route("/webhook/{path:path}", app.webhook, methods=webhook_methods),
        Route("/webhook-test/{path:path}", app.webhook, methods=webhook_methods),
        Route("/webhook-waiting/{id}", app.webhook_waiting, methods=["POST", "GET"]),
        Route("/api/v1/executions", app.list_executions, methods=["GET"]),
        Route("/api/v1/executions/{id}", app.get_execution, methods=["GET"]),
        Route("/api/v1/executions/{id}/stop", app.public_stop, methods=["POST"]),
        Route("/api/v1/{rest:path}", app.api_not_found, methods=webhook_methods),
        Route("/rest/login", app.rest_login, methods=["POST"]),
        Route("/rest/executions/{id}/stop", app.rest_stop, methods=["POST"]),
        Route("/_fake/{name:path}", app.control, methods=["GET", "POST", "PATCH", "PUT"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)
