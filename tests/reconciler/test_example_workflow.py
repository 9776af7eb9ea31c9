"""The example n8n workflow Veracity ships (src/veracity/examples/n8n_fulfil_workflow.json)
has the shape docs/external.md describes: a Webhook node answering through a Respond to
Webhook node, that node right after the webhook answering the execution id, and last an HTTP
Request node POSTing the result to the callback's complete URL with the callback token.

Node types and parameter names are n8n's own (checked against n8n's source:
packages/nodes-base/nodes/Webhook, RespondToWebhook/RespondToWebhook.node.ts — ``respondWith``
"json", ``responseBody``, ``options.responseCode`` — and HttpRequest/V3 — ``method``,
``url``, ``sendHeaders``, ``headerParameters.parameters``, ``sendBody``, ``specifyBody``
"json", ``jsonBody``). The fields the workflow reads from the trigger's body are resolved in
a body the adapter really sent."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from tests.reconciler._support import SLOW, WEBHOOK, Rig
from veracity.testing.fake_n8n import Script

EXAMPLE = "n8n_fulfil_workflow.json"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "external.md"
WEBHOOK_TYPE = "n8n-nodes-base.webhook"
RESPOND_TYPE = "n8n-nodes-base.respondToWebhook"
HTTP_TYPE = "n8n-nodes-base.httpRequest"
EXECUTION_ID_ANSWER = "{{ { executionId: $execution.id } }}"
BODY_REF = re.compile(r"\$\('Webhook'\)\.first\(\)\.json\.body((?:\.\w+)+)")
"""An expression reading the trigger's body as the Webhook node received it."""


@pytest.fixture(scope="module")
def workflow() -> dict[str, Any]:
    # read as package data: what an installed Veracity ships, not just a file in the repo
    text = resources.files("veracity.examples").joinpath(EXAMPLE).read_text("utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def nodes_by_name(workflow: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {node["name"]: node for node in workflow["nodes"]}


def next_nodes(workflow: dict[str, Any], name: str) -> list[str]:
    outputs = workflow["connections"].get(name, {}).get("main", [])
    return [link["node"] for output in outputs for link in output]


def chain(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    """The nodes from the webhook on, following each node's one main connection."""
    nodes = nodes_by_name(workflow)
    [start] = [n for n in workflow["nodes"] if n["type"] == WEBHOOK_TYPE]
    out = [start]
    while following := next_nodes(workflow, out[-1]["name"]):
        assert len(following) == 1, f"{out[-1]['name']} branches: {following}"
        assert following[0] not in [n["name"] for n in out], "a cycle"
        out.append(nodes[following[0]])
    return out


def test_it_is_an_importable_n8n_workflow(workflow: dict[str, Any]) -> None:
    assert isinstance(workflow["name"], str) and workflow["name"]
    names = [n["name"] for n in workflow["nodes"]]
    assert len(set(names)) == len(names), "node names must be unique"
    ids = [n["id"] for n in workflow["nodes"]]
    assert len(set(ids)) == len(ids), "node ids must be unique"
    for node in workflow["nodes"]:
        assert node["type"].startswith("n8n-nodes-base."), node["type"]
        assert isinstance(node["typeVersion"], int | float)
        assert isinstance(node["parameters"], dict)
        assert len(node["position"]) == 2
    for source, outputs in workflow["connections"].items():
        assert source in names
        for output in outputs["main"]:
            for link in output:
                assert link["node"] in names and link["type"] == "main"
    # every node is on the one path from the webhook
    assert sorted(n["name"] for n in chain(workflow)) == sorted(names)


def test_the_webhook_answers_through_a_respond_node(workflow: dict[str, Any]) -> None:
    webhooks = [n for n in workflow["nodes"] if n["type"] == WEBHOOK_TYPE]
    assert len(webhooks) == 1
    params = webhooks[0]["parameters"]
    assert params["httpMethod"] == "POST"
    assert params["path"] == WEBHOOK, "the path docs/external.md configures: /webhook/fulfil"
    assert params["responseMode"] == "responseNode"


def test_the_execution_id_is_answered_right_after_the_webhook(
    workflow: dict[str, Any]
) -> None:
    nodes = chain(workflow)
    respond = nodes[1]
    assert respond["type"] == RESPOND_TYPE, [n["type"] for n in nodes]
    params = respond["parameters"]
    assert params["respondWith"] == "json"
    # "=" marks an n8n expression; the expression itself is the one the docs give
    assert params["responseBody"] == "=" + EXECUTION_ID_ANSWER
    assert params.get("options", {}).get("responseCode", 200) == 200
    assert [n["type"] for n in nodes].count(RESPOND_TYPE) == 1


def test_last_an_http_request_posts_the_result_to_the_complete_url(
    workflow: dict[str, Any]
) -> None:
    last = chain(workflow)[-1]
    assert last["type"] == HTTP_TYPE
    assert next_nodes(workflow, last["name"]) == []
    params = last["parameters"]
    assert params["method"] == "POST"
    assert re.fullmatch(r"=\{\{ \$\('Webhook'\)\.first\(\)\.json\.body\.callback\.complete_url"
                        r" \}\}", params["url"]), params["url"]
    assert params["sendHeaders"] is True
    headers = {h["name"]: h["value"] for h in params["headerParameters"]["parameters"]}
    assert re.fullmatch(r"=Bearer \{\{ \$\('Webhook'\)\.first\(\)\.json\.body\.callback\.token"
                        r" \}\}", headers["Authorization"]), headers
    assert params["sendBody"] is True and params["specifyBody"] == "json"
    assert "result:" in params["jsonBody"], params["jsonBody"]


def test_the_docs_describe_this_shape(workflow: dict[str, Any]) -> None:
    docs = DOCS.read_text("utf-8")
    assert f"src/veracity/examples/{EXAMPLE}" in docs
    for phrase in ('responseMode: "responseNode"', EXECUTION_ID_ANSWER, "callback.complete_url",
                   "Authorization: Bearer <callback.token>", "**Webhook** (POST, path `fulfil`)",
                   "**Respond to Webhook**", "**HTTP Request**"):
        assert phrase in docs, phrase


async def test_the_fields_it_reads_are_in_the_trigger_body(
    workflow: dict[str, Any], rig: Rig
) -> None:
    """Every ``$('Webhook').first().json.body.<path>`` the workflow reads exists in the body
    the adapter POSTs to the webhook (n8n's Webhook node puts the request body in
    ``json.body``)."""
    started = await rig.start(Script.forever(callback="lose"), SLOW)
    body = rig.truth(started.run_id).trigger_body
    paths = {m.group(1) for m in BODY_REF.finditer(json.dumps(workflow))}
    assert {".callback.complete_url", ".callback.token"} <= paths, paths
    for path in paths:
        value: Any = body
        for key in path.strip(".").split("."):
            assert isinstance(value, dict) and key in value, (path, body)
            value = value[key]
        assert value not in (None, ""), path
