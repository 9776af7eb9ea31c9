"""The dashboard's pages and actions, served under ``/ui`` by the API's own app.

Pages are rendered on the server (Jinja2, autoescaped); htmx (vendored in static/) only
polls fragments of them while they show unfinished work. Every action is a plain
``<form method="post">`` checked for its origin and CSRF token (:mod:`.security`), asks
for a confirmation and a written reason, goes through the same
:class:`~veracity.control.ExecutionService` call as its API route, and needs that route's
scope (veracity.api.auth.ROUTE_ACCESS). See docs/dashboard.md.
"""

from __future__ import annotations

import functools
import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from starlette.routing import BaseRoute
from starlette.types import Scope

from veracity.api.auth import DASHBOARD_TOKEN_COOKIE
from veracity.control import MAX_TOPIC_LENGTH, ExecutionService, TokenService
from veracity.core.ffqn import is_cancellable
from veracity.core.states import Status
from veracity.core.tokens import Scope as TokenScope
from veracity.errors import Forbidden, InvalidInput, Unauthorized, VeracityError
from veracity.models import ApiToken, Execution, ExecutionFilter, HistoryEvent
from veracity.ui import present
from veracity.ui.filters import ListQuery, parse_list_query
from veracity.ui.security import CSRF_COOKIE, CSRF_FIELD, new_csrf_token, post_refusal

HISTORY_PAGE = 100
TREE_LIMIT = 200
FLAGGED_PAGE = 100
BULK_LIMIT = 10_000
"""Executions one bulk action may touch; a larger filter is refused, asking to narrow it."""
MAX_REASON = 1000
POLL_SECONDS = 2

STATIC: dict[str, str] = {
    "htmx.min.js": "text/javascript; charset=utf-8",
    "htmx.LICENSE.txt": "text/plain; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
}

SECURITY_HEADERS = {
    # no inline script or style anywhere: htmx and the stylesheet come from /ui/static
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; frame-ancestors 'none'; "
                               "form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}

NOTICES = {
    "cancel": "Cancellation requested; the history records your reason.",
    "cancel-unchanged": "Nothing to cancel: the execution had already ended or was "
                        "already being cancelled.",
    "pause": "Paused (a running execution parks at its next step); the history records "
             "your reason.",
    "pause-unchanged": "It was already paused.",
    "unpause": "Released; the history records your reason.",
    "send": "Message stored; the history records it with your reason.",
    "retry": "This is the retry: a new execution that replays the failed one's recorded "
             "calls up to its failure and runs on from there; its first event records your "
             "reason.",
    "resolve-attached": "External id attached.",
    "resolve-ended": "Ended: the engine confirmed the run finished.",
    "resolve-stop_requested": "The engine accepted the stop; the execution ends once it "
                              "confirms the run finished.",
    "resolve-forced": "Ended without the engine's confirmation (forced): it stays flagged "
                      "as forced.",
    "resolve-unconfirmed": "Ended on your word: the engine could not be asked (no external "
                           "id).",
    "login": "Signed in.",
    "logout": "Signed out.",
}


@dataclass(frozen=True, slots=True)
class Actions:
    """Which actions the detail page offers for an execution, and why not the others."""

    cancel: bool
    cancel_why_not: str | None
    pause: bool
    unpause: bool
    send: bool
    resolve: bool
    retry: bool


def actions_for(e: Execution) -> Actions:
    terminal = e.status.is_terminal
    delegated_running = e.status == Status.RUNNING and e.engine is not None
    why = None
    if terminal:
        why = f"it has ended ({e.status})"
    elif not is_cancellable(e.ffqn):
        why = ("only workflows whose name ends in -cancellable can be cancelled; "
               + ("resolve it instead (a run in an engine cannot be paused)"
                  if delegated_running else "pause it instead"))
    elif e.cancel_requested_at is not None:
        why = "cancellation was already requested"
    return Actions(
        cancel=why is None, cancel_why_not=why,
        pause=not terminal and e.status != Status.PAUSED and not delegated_running
        and e.pause_requested_at is None,
        unpause=e.status == Status.PAUSED or (
            e.status == Status.RUNNING and e.pause_requested_at is not None),
        send=not terminal,
        resolve=delegated_running,
        retry=e.status in (Status.FAILED, Status.FAILED_TRANSIENT),
    )


@functools.cache
def _environment() -> Environment:
    """The dashboard's templates, loaded once per process (shared by every app)."""
    env = Environment(
        loader=PackageLoader("veracity.ui", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(
        when=present.when, pretty=present.pretty, inline=present.inline,
        short=present.short, status_word=present.status_word, span=present.span)
    env.globals.update(
        ago=present.ago, unfinished=present.is_unfinished, urlencode=urlencode,
        poll_seconds=POLL_SECONDS, statuses=[s.value for s in Status],
        needs_a_person=present.NEEDS_A_PERSON, quote=quote,
        by_join_set=present.by_join_set, flag_advice=present.FLAG_ADVICE)
    return env


@functools.cache
def _static() -> dict[str, bytes]:
    """The dashboard's static files, read once per process."""
    return {name: resources.files("veracity.ui").joinpath("static", name).read_bytes()
            for name in STATIC}


class Dashboard:
    """One app's dashboard: the shared templates, rendered for that app (whether it
    requires auth)."""

    def __init__(self, *, auth_required: bool) -> None:
        self.auth_required = auth_required
        self.env = _environment()

    def render(self, request: Request, template: str, *, status: int = 200,
               **context: Any) -> HTMLResponse:
        csrf = request.cookies.get(CSRF_COOKIE) or new_csrf_token()
        token: ApiToken | None = getattr(request.state, "api_token", None)
        notice = NOTICES.get(request.query_params.get("notice", ""))
        html = self.env.get_template(template).render(
            request=request, csrf=csrf, csrf_field=CSRF_FIELD, signed_in=token,
            auth_required=self.auth_required, notice=context.pop("notice", notice),
            path=request.url.path, **context)
        response = HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)
        if request.cookies.get(CSRF_COOKIE) != csrf:
            response.set_cookie(CSRF_COOKIE, csrf, httponly=True, samesite="strict",
                                path="/ui", secure=request.url.scheme == "https")
        return response

    def error(self, request: Request, status: int, title: str, message: str,
              **context: Any) -> HTMLResponse:
        return self.render(request, "error.html", status=status, title=title,
                           message=message, **context)


def _actor(request: Request) -> str:
    token: ApiToken | None = getattr(request.state, "api_token", None)
    return f"dashboard:{token.name}" if token is not None else "dashboard"


def _own_origin(request: Request) -> str:
    return f"{request.url.scheme}://{request.url.netloc}"


async def _form(request: Request) -> dict[str, str]:
    """The posted fields (the last value of each), as text."""
    form = await request.form()
    out: dict[str, str] = {}
    for key, value in form.multi_items():
        if isinstance(value, str):
            out[key] = value
    return out


def _reason(form: Mapping[str, str]) -> tuple[str | None, str | None]:
    reason = form.get("reason", "").strip()
    if not reason:
        return None, "a written reason is needed: it is recorded in the history"
    if len(reason) > MAX_REASON or "\x00" in reason:
        return None, f"the reason must be at most {MAX_REASON} characters (no NUL)"
    if form.get("confirm") != "yes":
        return None, "tick the confirmation box to confirm the action"
    return reason, None


def install_dashboard(app: FastAPI, *, auth_required: bool) -> None:
    """Add the dashboard's routes to the API's app (each listed in ROUTE_ACCESS). The
    routes are built once per process and shared; each app's own :class:`Dashboard` (whether
    auth is required) is on ``app.state.dashboard``."""
    ui = Dashboard(auth_required=auth_required)
    app.state.dashboard = ui
    app.state.dashboard_refusal = functools.partial(_refusal, ui)
    app.router.routes.extend(_dashboard_routes())


def _refusal(ui: Dashboard, scope: Scope, status: int, message: str,
             needed: str | None) -> Response:
    """What a request the API's token check refused gets on a dashboard page."""
    request = Request(scope)
    if status == 401:
        target = request.url.path
        if request.method == "GET" and request.url.query:
            target += "?" + request.url.query
        elif request.method != "GET":
            # a post has no page of its own: back to the page it was made from
            match = re.fullmatch(r"(/ui/executions/[^/]+)/[a-z]+", target)
            target = match.group(1) if match else "/ui/executions"
        response: Response = RedirectResponse(
            "/ui/login?" + urlencode({"next": target}), status_code=303)
        if request.cookies.get(DASHBOARD_TOKEN_COOKIE):
            response.delete_cookie(DASHBOARD_TOKEN_COOKIE, path="/ui")
        return response
    return ui.error(request, 403, "Not allowed with this token",
                    f"{message}. Sign in with a token that has the scope {needed} "
                    "(or admin).", needed=needed)


class _AppsDashboard:
    """``ui`` in the shared routes: each call goes to the :class:`Dashboard` of the app the
    request came to (``app.state.dashboard``)."""

    @staticmethod
    def of(request: Request) -> Dashboard:
        dashboard: Dashboard = request.app.state.dashboard
        return dashboard

    def render(self, request: Request, template: str, *, status: int = 200,
               **context: Any) -> HTMLResponse:
        return self.of(request).render(request, template, status=status, **context)

    def error(self, request: Request, status: int, title: str, message: str,
              **context: Any) -> HTMLResponse:
        return self.of(request).error(request, status, title, message, **context)


@functools.cache
def _dashboard_routes() -> tuple[BaseRoute, ...]:
    router = APIRouter()
    _define_dashboard(router)
    return tuple(router.routes)


def _define_dashboard(app: APIRouter) -> None:
    ui = _AppsDashboard()

    def service_of(request: Request) -> ExecutionService:
        service: ExecutionService = request.app.state.service
        return service

    async def checked_post(request: Request) -> tuple[dict[str, str], Response | None]:
        form = await _form(request)
        why = post_refusal(own_origin=_own_origin(request), headers=request.headers,
                           cookie=request.cookies.get(CSRF_COOKIE), field=form.get(CSRF_FIELD))
        if why is not None:
            return form, ui.error(request, 403, "Refused", why)
        return form, None

    # -- entry, static files, sign-in ----------------------------------------------------

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/ui/executions", status_code=307)

    @app.get("/ui", include_in_schema=False)
    async def ui_root() -> RedirectResponse:
        return RedirectResponse("/ui/executions", status_code=307)

    @app.get("/ui/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        if name not in STATIC:
            return Response("not found", status_code=404, media_type="text/plain")
        return Response(_static()[name], media_type=STATIC[name],
                        headers={"Cache-Control": "public, max-age=3600",
                                 "X-Content-Type-Options": "nosniff"})

    def _safe_next(target: str | None) -> str:
        # only a path of the dashboard itself: never an open redirect
        if target and target.startswith("/ui/") and not target.startswith("//") \
                and "\\" not in target:
            return target
        return "/ui/executions"

    @app.get("/ui/login", include_in_schema=False)
    async def login_page(request: Request, next: str | None = None) -> HTMLResponse:
        return ui.render(request, "login.html", next=_safe_next(next), error=None)

    @app.post("/ui/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        form, refused = await checked_post(request)
        if refused is not None:
            return refused
        target = _safe_next(form.get("next"))
        token = form.get("token", "").strip()
        try:
            if not token:
                raise Unauthorized("paste an API token")
            await TokenService(service_of(request).store).authenticate(
                token, TokenScope.EXECUTIONS_READ, route="GET /ui/executions")
        except (Unauthorized, Forbidden) as exc:
            return ui.render(request, "login.html", status=exc.status, next=target,
                             error=exc.message)
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(DASHBOARD_TOKEN_COOKIE, token, httponly=True, samesite="strict",
                            path="/ui", secure=request.url.scheme == "https")
        return response

    @app.post("/ui/logout", include_in_schema=False)
    async def logout(request: Request) -> Response:
        _, refused = await checked_post(request)
        if refused is not None:
            return refused
        response = RedirectResponse("/ui/login?notice=logout", status_code=303)
        response.delete_cookie(DASHBOARD_TOKEN_COOKIE, path="/ui")
        return response

    # -- executions ------------------------------------------------------------------------

    def _query(request: Request) -> ListQuery:
        return parse_list_query(parse_qs(request.url.query, keep_blank_values=True))

    async def _counts(service: ExecutionService) -> dict[str, int]:
        statuses = await service.counts_in(present.NEEDS_A_PERSON)
        counts = {s: statuses.get(s, 0) for s in present.NEEDS_A_PERSON}
        counts["flagged"] = sum((await service.flag_counts()).values())
        counts["stranded"] = sum(d.summary.stranded for d in await service.deployments())
        return counts

    @app.get("/ui/executions", include_in_schema=False)
    async def executions(request: Request) -> HTMLResponse:
        service = service_of(request)
        query = _query(request)
        fragment = request.query_params.get("fragment") == "list"
        live = request.query_params.get("live") != "0"
        now = await service.store.db_now()
        items: list[Execution] = []
        waiting: dict[uuid.UUID, str] = {}
        next_cursor = None
        errors = list(query.errors)
        if not errors and query.filter is not None:
            try:
                if query.execution_id is not None:
                    try:
                        found = await service.get(query.execution_id)
                    except VeracityError:
                        found = None
                    if found is not None and _matches(found, query.filter):
                        items = [found]
                        waiting = await service.waiting_reasons(items)
                else:
                    page = await service.page(query.filter, limit=query.limit,
                                              cursor=query.cursor or None)
                    items, waiting, next_cursor = page.items, page.waiting, page.next_cursor
            except VeracityError as exc:
                errors.append(exc.message)
        status = 422 if errors else 200
        context: dict[str, Any] = dict(
                       query=query, items=items, waiting=waiting, next_cursor=next_cursor,
                       errors=errors, now=now, live=live,
                       polling=live and not errors and not query.cursor and (
                           not items or any(not e.status.is_terminal for e in items)))
        counts = await _counts(service)
        if fragment:
            # the counts above the list move with it (an out-of-band swap)
            return ui.render(request, "_executions_list.html", status=status, oob=True,
                             counts=counts, **context)
        return ui.render(request, "executions.html", status=status, nav="executions",
                         counts=counts, **context)

    def _matches(e: Execution, f: ExecutionFilter) -> bool:
        return ((not f.statuses or e.status in f.statuses)
                and (f.ffqn_prefix is None or e.ffqn.startswith(f.ffqn_prefix))
                and (f.deployment_id is None or e.deployment_id == f.deployment_id)
                and (f.created_after is None or e.created_at > f.created_after)
                and (f.created_before is None or e.created_at < f.created_before)
                and (f.flagged is None or (e.flagged_at is not None) == f.flagged))

    def _history_query(request: Request) -> tuple[list[str], int, str | None]:
        kinds = [k for k in request.query_params.getlist("kind") if k][:50]
        after_text = request.query_params.get("after", "")
        error = None
        after = 0
        if after_text:
            if not (after_text.isascii() and after_text.isdigit()) \
                    or int(after_text) > 2**31 - 1:
                error = f"after: {after_text[:40]!r} is not a position in the history"
            else:
                after = int(after_text)
        if any(len(k) > 64 for k in kinds):
            error = "kind: at most 64 characters"
        return kinds, after, error

    async def _detail(request: Request, execution_id: str, *, status: int = 200,
                      error: str | None = None, form: Mapping[str, str] | None = None
                      ) -> HTMLResponse:
        service = service_of(request)
        try:
            e = await service.get(execution_id)
        except VeracityError as exc:
            return ui.error(request, 404 if exc.status in (400, 404) else exc.status,
                            "No such execution", exc.message)
        now = await service.store.db_now()
        waiting = (await service.waiting_reasons([e])).get(e.id)
        kinds, after, history_error = _history_query(request)
        events: list[HistoryEvent] = []
        next_after: int | None = None
        if history_error is None:
            events, next_after = await service.history_page_of_kinds(
                e.id, kinds, after_seq=after, limit=HISTORY_PAGE)
        fragment = request.query_params.get("fragment")
        live = request.query_params.get("live") != "0"
        looker = service.looker
        limit = looker.limits.get(e.ffqn) if looker is not None and e.engine else None
        last_look = None
        if e.engine is not None:
            looks, _ = await service.history_page_of_kinds(
                e.id, ["flagged", "unflagged", "end_requested"], limit=1000)
            last_look = looks[-1] if looks else None
        context: dict[str, Any] = dict(e=e, now=now, waiting=waiting, live=live, limit=limit,
                       last_look=last_look, events=events, kinds=kinds,
                       next_after=next_after, history_error=history_error, after=after,
                       kind_query=urlencode([("kind", k) for k in kinds]),
                       polling=live and not e.status.is_terminal and after == 0)
        if fragment == "header":
            return ui.render(request, "_execution_header.html", **context)
        if fragment == "history":
            return ui.render(request, "_history.html", **context)
        tree = await service.descendants(e.id, limit=TREE_LIMIT)
        parent = await service.store.execution_get(e.parent_id) if e.parent_id else None
        return ui.render(
            request, "execution.html", status=status, nav="executions", **context,
            kind_counts=await service.history_kinds(e.id), tree=tree,
            tree_full=sum(len(v) for v in tree.values()) >= TREE_LIMIT,
            parent=parent, actions=actions_for(e), error=error, form=form or {},
            max_topic=MAX_TOPIC_LENGTH)

    @app.get("/ui/executions/{execution_id}", include_in_schema=False)
    async def execution(request: Request, execution_id: str) -> HTMLResponse:
        return await _detail(request, execution_id)

    async def _act(request: Request, execution_id: str, action: str) -> Response:
        form, refused = await checked_post(request)
        if refused is not None:
            return refused
        service = service_of(request)
        reason, problem = _reason(form)
        try:
            if problem is not None:
                raise InvalidInput(problem)
            assert reason is not None
            actor = _actor(request)
            notice = action
            if action == "cancel":
                _, changed = await service.cancel(execution_id, actor=actor, reason=reason)
                notice = "cancel" if changed else "cancel-unchanged"
            elif action == "pause":
                _, changed = await service.pause(execution_id, actor=actor, reason=reason)
                notice = "pause" if changed else "pause-unchanged"
            elif action == "unpause":
                await service.unpause(execution_id, actor=actor, reason=reason)
            elif action == "retry":
                new = await service.retry(execution_id, actor=actor, reason=reason)
                return RedirectResponse(f"/ui/executions/{new.id}?notice=retry",
                                        status_code=303)
            elif action == "send":
                topic = form.get("topic", "")
                text = form.get("payload", "").strip() or "null"
                try:
                    payload = json.loads(text)
                except ValueError as exc:
                    raise InvalidInput(f"the payload is not JSON: {exc}") from None
                await service.send(execution_id, topic, payload, actor=actor, reason=reason)
            else:
                what = form.get("action", "")
                external = form.get("external_execution_id", "").strip() or None
                resolved = await service.resolve(
                    execution_id, action=what, external_id=external if what == "attach"
                    else None, reason=reason, actor=actor, force=form.get("force") == "yes")
                notice = f"resolve-{resolved.outcome}"
        except VeracityError as exc:
            if exc.status in (400, 404):
                return ui.error(request, 404, "No such execution", exc.message)
            state = exc.details.get("state")
            known = state is None or f"is {state}" in exc.message
            message = exc.message + ("" if known else f" (the execution is {state})")
            return await _detail(request, execution_id, status=exc.status,
                                 error=f"{action} refused ({exc.code}): {message}", form=form)
        return RedirectResponse(
            f"/ui/executions/{quote(execution_id)}?notice={notice}", status_code=303)

    @app.post("/ui/executions/{execution_id}/cancel", include_in_schema=False)
    async def cancel(request: Request, execution_id: str) -> Response:
        return await _act(request, execution_id, "cancel")

    @app.post("/ui/executions/{execution_id}/pause", include_in_schema=False)
    async def pause(request: Request, execution_id: str) -> Response:
        return await _act(request, execution_id, "pause")

    @app.post("/ui/executions/{execution_id}/unpause", include_in_schema=False)
    async def unpause(request: Request, execution_id: str) -> Response:
        return await _act(request, execution_id, "unpause")

    @app.post("/ui/executions/{execution_id}/messages", include_in_schema=False)
    async def send(request: Request, execution_id: str) -> Response:
        return await _act(request, execution_id, "send")

    @app.post("/ui/executions/{execution_id}/retry", include_in_schema=False)
    async def retry(request: Request, execution_id: str) -> Response:
        return await _act(request, execution_id, "retry")

    @app.post("/ui/executions/{execution_id}/resolve", include_in_schema=False)
    async def resolve(request: Request, execution_id: str) -> Response:
        return await _act(request, execution_id, "resolve")

    # -- bulk actions over the current filter -------------------------------------------

    async def _matching(service: ExecutionService, query: ListQuery) -> list[Execution]:
        """Every execution the filter matches, up to BULK_LIMIT + 1."""
        assert query.filter is not None
        out: list[Execution] = []
        cursor = None
        while len(out) <= BULK_LIMIT:
            page = await service.page(query.filter, limit=1000, cursor=cursor)
            out += page.items
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        return out

    def _applicable(action: str, e: Execution) -> bool:
        allowed = actions_for(e)
        return allowed.cancel if action == "cancel" else allowed.pause

    async def _bulk_page(request: Request, query: ListQuery, action: str, *,
                         status: int = 200, error: str | None = None,
                         done: dict[str, int] | None = None) -> HTMLResponse:
        service = service_of(request)
        errors = list(query.errors)
        if action not in ("cancel", "pause"):
            errors.append(f"action: {action[:40]!r} is not cancel or pause")
        if not errors and not query.any:
            errors.append("set a filter first: a bulk action applies to what the filter "
                          "matches, and never to every execution")
        matching: list[Execution] = []
        if not errors:
            try:
                matching = await _matching(service, query)
            except VeracityError as exc:
                errors.append(exc.message)
        too_many = len(matching) > BULK_LIMIT
        applicable = [e for e in matching[:BULK_LIMIT] if _applicable(action, e)]
        return ui.render(
            request, "bulk.html", status=422 if errors and status == 200 else status,
            nav="executions", query=query, action=action, errors=errors, error=error,
            matching=len(matching[:BULK_LIMIT]), applicable=len(applicable),
            too_many=too_many, limit=BULK_LIMIT, done=done)

    @app.get("/ui/bulk", include_in_schema=False)
    async def bulk(request: Request) -> HTMLResponse:
        return await _bulk_page(request, _query(request),
                                request.query_params.get("action", ""))

    async def _bulk_act(request: Request, action: str) -> Response:
        form, refused = await checked_post(request)
        if refused is not None:
            return refused
        query = parse_list_query(parse_qs(form.get("filter", ""), keep_blank_values=True))
        reason, problem = _reason(form)
        expected = form.get("expected", "")
        if problem is not None or query.errors or not query.any:
            return await _bulk_page(request, query, action, status=422,
                                    error=problem or "the filter is not valid")
        assert reason is not None
        service = service_of(request)
        matching = await _matching(service, query)
        if len(matching) > BULK_LIMIT:
            return await _bulk_page(request, query, action, status=422,
                                    error="the filter matches too many executions")
        targets = [e for e in matching if _applicable(action, e)]
        if expected != str(len(targets)):
            return await _bulk_page(
                request, query, action, status=409,
                error=f"the filter now matches {len(targets)} executions to {action}, not "
                      f"the {expected[:12]} you confirmed: check and confirm again")
        done = {"changed": 0, "unchanged": 0, "refused": 0}
        actor = _actor(request)
        for e in targets:
            try:
                if action == "cancel":
                    _, changed = await service.cancel(e.id, actor=actor, reason=reason)
                else:
                    _, changed = await service.pause(e.id, actor=actor, reason=reason)
                done["changed" if changed else "unchanged"] += 1
            except VeracityError:
                done["refused"] += 1  # it moved on meanwhile (ended, or became running)
        return await _bulk_page(request, query, action, done=done)

    @app.post("/ui/bulk/cancel", include_in_schema=False)
    async def bulk_cancel(request: Request) -> Response:
        return await _bulk_act(request, "cancel")

    @app.post("/ui/bulk/pause", include_in_schema=False)
    async def bulk_pause(request: Request) -> Response:
        return await _bulk_act(request, "pause")

    # -- the other pages -----------------------------------------------------------------

    @app.get("/ui/flagged", include_in_schema=False)
    async def flagged(request: Request) -> HTMLResponse:
        service = service_of(request)
        now = await service.store.db_now()
        cursor = request.query_params.get("cursor") or None
        try:
            page = await service.page(ExecutionFilter(flagged=True), limit=FLAGGED_PAGE,
                                      cursor=cursor)
        except VeracityError as exc:
            return ui.error(request, exc.status, "Bad page", exc.message)
        rows = []
        for e in page.items:
            flags, _ = await service.history_page_of_kinds(e.id, ["flagged"], limit=1000)
            rows.append((e, flags[-1] if flags else None, actions_for(e)))
        return ui.render(request, "flagged.html", nav="flagged", rows=rows, now=now,
                         next_cursor=page.next_cursor, counts=await service.flag_counts())

    @app.get("/ui/workers", include_in_schema=False)
    async def workers(request: Request) -> HTMLResponse:
        service = service_of(request)
        now = await service.store.db_now()
        views = await service.workers(limit=1000)
        held: dict[str, int] = {}
        running = await service.page(ExecutionFilter(statuses=(Status.RUNNING,)), limit=1000)
        for e in running.items:
            if e.lease_owner is not None:
                held[e.lease_owner] = held.get(e.lease_owner, 0) + 1
        return ui.render(request, "workers.html", nav="workers", workers=views, now=now,
                         held=held, held_capped=running.next_cursor is not None)

    @app.get("/ui/deployments", include_in_schema=False)
    async def deployments(request: Request) -> HTMLResponse:
        service = service_of(request)
        now = await service.store.db_now()
        return ui.render(request, "deployments.html", nav="deployments", now=now,
                         deployments=await service.deployments())

    @app.get("/ui/crons", include_in_schema=False)
    async def crons(request: Request) -> HTMLResponse:
        service = service_of(request)
        now = await service.store.db_now()
        return ui.render(request, "crons.html", nav="crons", now=now,
                         crons=await service.crons())

    @app.get("/ui/{rest:path}", include_in_schema=False)
    async def unknown(request: Request, rest: str) -> HTMLResponse:
        # last: whatever no page above takes is a dashboard 404, not the API's JSON one
        return ui.error(request, 404, "No such page",
                        "The dashboard has no such page (an execution's id, if you typed "
                        "one, is a UUID).")
