"""The OpenAPI document says what the server enforces (README: HTTP API): ids are UUIDs,
workflow names, prefixes, topics and statuses have the patterns the server checks, every
time the API takes has one format (RFC 3339 with its offset, refused otherwise), resolve's
fields depend on its action as the server says; every operation has a summary and lists
exactly the errors it can answer: those its input, path, body and access give it, checked
here from each route's own parameters, and the state errors, each shown answered by a
real request (tests/api/test_route_errors.py)."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import jsonschema_rs
import pytest
from fastapi import FastAPI

from veracity.api.auth import ROUTE_ACCESS, Unscoped
from veracity.api.openapi import ROUTE_ERRORS, ROUTE_SUMMARIES
from veracity.core.ffqn import InvalidFfqn, validate_ffqn, validate_ffqn_prefix
from veracity.core.states import Status

METHODS = ("get", "put", "post", "delete", "patch")


def document(api: FastAPI) -> dict[str, Any]:
    return api.openapi()


def operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(m.upper(), path, op) for path, ops in doc["paths"].items()
            for m, op in ops.items() if m in METHODS]


def resolve_ref(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def non_null(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema of a value that may be null: its other branch."""
    if "anyOf" in schema:
        others: list[dict[str, Any]] = [s for s in schema["anyOf"] if s.get("type") != "null"]
        (other,) = others
        return other
    return schema


def body_schema(doc: dict[str, Any], op: dict[str, Any]) -> dict[str, Any] | None:
    content = op.get("requestBody", {}).get("content", {}).get("application/json")
    return None if content is None else resolve_ref(doc, non_null(content["schema"]))


def derived_errors(doc: dict[str, Any], method: str, path: str,
                   op: dict[str, Any]) -> set[int]:
    """The error statuses a route answers because of what it takes, from its own entry:
    a path id (400 invalid_id for an execution id, 404 unknown), a body (413, 415, 422), a
    query that can be invalid (422; 400 for a cursor), its access (401, 403) and the
    database (503, on every route but /metrics). The middleware answers 413 on any route
    (a body over the limit, read or not) and 415 on any write under /v1 (a body declared
    not JSON; tests/api/test_bodies.py)."""
    out: set[int] = {413}
    if method in {"POST", "PUT", "PATCH"} and path.startswith("/v1/"):
        out.add(415)
    params = {p["name"]: p for p in op.get("parameters", [])}
    if "execution_id" in params:
        out |= {400, 404}
    if "deployment_id" in params and params["deployment_id"]["in"] == "path":
        out |= {404}
    if body_schema(doc, op) is not None:
        out |= {413, 415, 422}
    queries = [p for p in params.values() if p["in"] == "query"]
    if any(p["name"] == "cursor" for p in queries):
        out.add(400)
    if any(non_null(p["schema"]) != {"type": "string"} for p in queries):
        out.add(422)  # a limit, a time, a status: each can be given wrong
    access = ROUTE_ACCESS[(method, path)]
    if access is Unscoped.CALLBACK:
        out.add(401)
    elif access is not Unscoped.OPEN:
        out |= {401, 403}
    if path != "/metrics":
        out.add(503)
    return out


STATE_ERRORS = {409}
"""Errors only an execution's state gives (tests/api/test_route_errors.py shows each)."""


def test_every_operation_has_a_summary_and_exactly_the_errors_it_can_answer(
    api: FastAPI
) -> None:
    doc = document(api)
    ops = operations(doc)
    served = {(m, p) for m, p, _ in ops}
    assert served == set(ROUTE_ERRORS) == set(ROUTE_SUMMARIES)
    failures = []
    for method, path, op in ops:
        if not op.get("summary") or op["summary"] != ROUTE_SUMMARIES[(method, path)]:
            failures.append(f"{method} {path}: summary {op.get('summary')!r}")
        listed = {int(s) for s in op["responses"] if int(s) >= 400}
        state = {s for s in ROUTE_ERRORS[(method, path)] if s in STATE_ERRORS}
        expected = derived_errors(doc, method, path, op) | state
        if listed != expected:
            failures.append(f"{method} {path}: lists {sorted(listed)}, can answer "
                            f"{sorted(expected)}")
        for status in listed:
            response = op["responses"][str(status)]
            ref = response["content"]["application/json"]["schema"]["$ref"]
            if not ref.endswith("/ErrorOut") or "`" not in response["description"]:
                failures.append(f"{method} {path} {status}: {response}")
        for status, codes in ROUTE_ERRORS[(method, path)].items():
            if not codes or not all(f"`{c}`" in op["responses"][str(status)]["description"]
                                    for c in codes):
                failures.append(f"{method} {path} {status}: codes not all described")
    assert not failures, "\n".join(failures)


def test_ids_are_uuids(api: FastAPI) -> None:
    doc = document(api)
    for _, path, op in operations(doc):
        for p in op.get("parameters", []):
            if p["name"] == "execution_id":
                assert p["schema"]["format"] == "uuid", (path, p)
    schemas = doc["components"]["schemas"]
    for model, field in [("ExecutionOut", "id"), ("ExecutionOut", "parent_id"),
                         ("ExecutionOut", "retry_of"), ("MessageOut", "execution_id"),
                         ("CronOut", "last_execution_id")]:
        assert non_null(schemas[model]["properties"][field])["format"] == "uuid", (model, field)
    assert schemas["AdoptOut"]["properties"]["ids"]["items"]["format"] == "uuid"


NAMES = ["shop:orders/process.run", "a:b/c.d", "a-1_x:p.q-r/i_f.f-n-cancellable",
         "Shop:orders/process.run", "shop:orders/process", "shop:orders.process.run",
         "shop:/process.run", ":orders/process.run", "shop:orders/process.run\n",
         "shop:orders/process.run ", "1a:b/c.d", "a:b/c.d.e", "", "a", "é:b/c.d"]
PREFIXES = ["shop", "shop:", "shop:orders", "shop:orders/", "shop:orders/process.",
            "shop:orders/process.run", "shop:orders/process.run\n", "Shop", ":", "shop::",
            "shop:orders//", "shop:orders/process.run.x", "1", "a b"]


def agrees(pattern: str, value: str, check: Any) -> bool:
    try:
        check(value)
        server = True
    except InvalidFfqn:
        server = False
    # JSON Schema patterns are ECMA 262: "$" matches only at the very end
    document_says = re.search(pattern.replace("$", r"\Z"), value) is not None
    return server == document_says


def test_ffqn_and_prefix_patterns_are_the_servers(api: FastAPI) -> None:
    doc = document(api)
    schemas = doc["components"]["schemas"]
    ffqn = schemas["SubmitRequest"]["properties"]["ffqn"]["pattern"]
    prefix = non_null(schemas["AdoptRequest"]["properties"]["ffqn_prefix"])["pattern"]
    assert [n for n in NAMES if not agrees(ffqn, n, validate_ffqn)] == []
    assert [p for p in PREFIXES if not agrees(prefix, p, validate_ffqn_prefix)] == []


async def test_the_status_pattern_is_what_the_list_accepts(
    api: FastAPI, client: httpx.AsyncClient
) -> None:
    doc = document(api)
    (status,) = [p for p in doc["paths"]["/v1/executions"]["get"]["parameters"]
                 if p["name"] == "status"]
    pattern = non_null(status["schema"])["items"]["pattern"].replace("$", r"\Z")
    for s in Status:
        assert s.value in non_null(status["schema"])["items"]["description"]
    samples = [*(s.value for s in Status), "pending,running", " pending , failed ", "",
               ",", "pending,", "bogus", "Pending", "pending running", "pending,bogus",
               "failedx", "failed_transient,cancelled", "completedcompleted"]
    failures = []
    for sample in samples:
        response = await client.get("/v1/executions", params={"status": sample})
        accepted = response.status_code == 200
        if accepted != (re.search(pattern, sample) is not None):
            failures.append(f"{sample!r}: server {response.status_code}")
        if not accepted and response.json()["error"]["code"] != "invalid_status":
            failures.append(f"{sample!r}: {response.text}")
    assert not failures, failures


def test_topics_have_no_nul(api: FastAPI) -> None:
    topic = document(api)["components"]["schemas"]["MessageRequest"]["properties"]["topic"]
    assert (topic["minLength"], topic["maxLength"]) == (1, 256)
    assert re.search(topic["pattern"], "a\x00b") is None
    assert re.search(topic["pattern"], "approval ✓") is not None


TIMES = {("GET", "/v1/executions"): ["created_after", "created_before"]}


def test_every_time_the_api_takes_has_one_format(api: FastAPI) -> None:
    doc = document(api)
    found = []
    for method, path, op in operations(doc):
        for p in op.get("parameters", []):
            if p["name"].endswith(("_at", "_after", "_before")):
                found.append((method, path, p["name"]))
                assert non_null(p["schema"])["format"] == "date-time", p
        body = body_schema(doc, op)
        for name, prop in (body or {}).get("properties", {}).items():
            if name.endswith(("_at", "_after", "_before")):
                found.append((method, path, name))
                assert non_null(prop)["format"] == "date-time", (path, name, prop)
    assert sorted(found) == [("GET", "/v1/executions", "created_after"),
                             ("GET", "/v1/executions", "created_before"),
                             ("POST", "/v1/executions", "scheduled_at")]


@pytest.mark.parametrize("value", [
    "1700000000", "1700000000.5", "2030-01-01T00:00:00", "2030-01-01", "2030-01-01T00:00Z",
    "tomorrow", "20300101T000000Z", "2030-01-01T00:00:00+0100",
])
async def test_a_time_in_another_format_is_refused_everywhere(
    client: httpx.AsyncClient, value: str
) -> None:
    listed = await client.get("/v1/executions", params={"created_after": value})
    submitted = await client.post("/v1/executions", json={
        "ffqn": "shop:orders/process.run", "params": ["o", 1], "scheduled_at": value})
    for response in (listed, submitted):
        assert response.status_code == 422, response.text
        assert "RFC 3339" in response.json()["error"]["message"], response.text
    fine = await client.get("/v1/executions", params={"created_after": "2030-01-01T00:00:00Z"})
    assert fine.status_code == 200


RESOLVE_BODIES: list[tuple[dict[str, Any], bool]] = [
    ({"action": "attach", "external_execution_id": "981", "reason": "found it"}, True),
    ({"action": "attach", "reason": "found it"}, False),
    ({"action": "attach", "external_execution_id": None, "reason": "r"}, False),
    ({"action": "attach", "external_execution_id": "981", "reason": "r", "force": True}, False),
    ({"action": "attach", "external_execution_id": "981", "reason": "r", "force": False}, True),
    ({"action": "fail", "reason": "gone"}, True),
    ({"action": "cancel", "reason": "gone", "force": True}, True),
    ({"action": "fail", "external_execution_id": "981", "reason": "gone"}, False),
    ({"action": "cancel", "external_execution_id": None, "reason": "gone"}, True),
    ({"action": "fail", "reason": "   "}, False),
    ({"action": "stop", "reason": "r"}, False),
]


async def test_resolve_fields_depend_on_its_action_as_the_server_checks(
    api: FastAPI, client: httpx.AsyncClient
) -> None:
    """Each body the document allows, the server takes past its input checks (to the
    execution: an unknown one here, 404); each one it does not, the server refuses (422)."""
    schema = document(api)["components"]["schemas"]["ResolveRequest"]
    validator = jsonschema_rs.validator_for(schema)
    unknown = "00000000-0000-4000-8000-000000000000"
    failures = []
    for body, valid in RESOLVE_BODIES:
        if validator.is_valid(body) != valid:
            failures.append(f"document: {body} valid={not valid}")
        response = await client.put(f"/v1/executions/{unknown}/resolve", json=body)
        if response.status_code != (404 if valid else 422):
            failures.append(f"server: {body} -> {response.status_code} {response.text}")
    assert not failures, "\n".join(failures)


def test_the_document_cites_the_repositorys_docs_only(api: FastAPI) -> None:
    text = json.dumps(document(api))
    for word in ("DESIGN", "STYLE.md", "seed"):
        assert word not in text, word
    assert "docs/states.md" in text and "docs/external.md" in text


def test_the_readme_error_table_names_every_code_the_routes_answer() -> None:
    """README's table of errors (status -> codes) has each code a route lists, under the
    status it is listed with."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    rows = {int(m[1]): m[2] for m in re.finditer(r"^\| (\d{3}) \| (.*) \|$", readme, re.M)}
    missing = sorted({f"{status} {code}" for errors in ROUTE_ERRORS.values()
                      for status, codes in errors.items() for code in codes
                      if f"`{code}`" not in rows.get(status, "")})
    assert not missing, missing


def test_a_submission_links_to_the_operations_on_its_execution(api: FastAPI) -> None:
    doc = document(api)
    submit = doc["paths"]["/v1/executions"]["post"]
    on_one = {op["operationId"] for m, path, op in operations(doc)
              if path.startswith("/v1/executions/{execution_id}")}
    for status in ("200", "201"):
        links = submit["responses"][status]["links"]
        assert {link["operationId"] for link in links.values()} == on_one
        assert all(link["parameters"] == {"execution_id": "$response.body#/id"}
                   for link in links.values())
    # the server's own workflows are the examples of a submission's name
    ffqn = doc["components"]["schemas"]["SubmitRequest"]["properties"]["ffqn"]
    assert ffqn["examples"] == sorted(api.state.service.workflows)
