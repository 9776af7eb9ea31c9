"""The example n8n workflow Veracity ships (src/veracity/examples/n8n_fulfil_workflow.json)
has the shape docs/external.md describes: a Webhook node answering through a Respond to
Webhook node, that node right after the webhook answering the execution id, last an HTTP
Request node POSTing the result to the callback's complete URL with the callback token, and
an error branch from the work node: an HTTP Request node POSTing the error to the callback's
fail URL with the same token.

Node types and parameter names are n8n's own (checked against n8n's source:
packages/nodes-base/nodes/Webhook, RespondToWebhook/RespondToWebhook.node.ts — ``respondWith``
"json", ``responseBody``, ``options.responseCode`` — and HttpRequest/V3 — ``method``,
``url``, ``sendHeaders``, ``headerParameters.parameters``, ``sendBody``, ``specifyBody``
"json", ``jsonBody``). The error branch is n8n's per-node setting "On Error: Continue (using
error output)": ``onError: "continueErrorOutput"`` on the node itself (``INode.onError``, not
a parameter), which gives the node a last, extra main output (``NodeHelpers.getNodeOutputs``);
``connections[node].main[1]`` is wired from it. A Code node that throws with it set outputs
``{"error": <message>}`` (``continueOnFail()``), and ``WorkflowExecute.handleNodeErrorOutput``
moves that item to the error output, so the branch reads ``$json.error``. The fields the
workflow reads from the trigger's body are resolved in a body the adapter really sent."""

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


def outputs(workflow: dict[str, Any], name: str) -> list[list[str]]:
    """The nodes each main output of ``name`` leads to, by output index."""
    return [[link["node"] for link in output] for output in
            workflow["connections"].get(name, {}).get("main", [])]


def chain(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    """The nodes from the webhook on, following each node's first main output (the success
    path; an error output, when a node has one, is its second)."""
    nodes = nodes_by_name(workflow)
    [start] = [n for n in workflow["nodes"] if n["type"] == WEBHOOK_TYPE]
    out = [start]
    while (wired := outputs(workflow, out[-1]["name"])) and wired[0]:
        following = wired[0]
        assert len(following) == 1, f"{out[-1]['name']} branches: {following}"
        assert following[0] not in [n["name"] for n in out], "a cycle"
        out.append(nodes[following[0]])
    return out


def error_branches(workflow: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Node name -> the node its error output leads to, for every node on the success path
    that has one."""
    nodes = nodes_by_name(workflow)
    found: dict[str, dict[str, Any]] = {}
    for node in chain(workflow):
        wired = outputs(workflow, node["name"])
        if len(wired) > 1:
            assert len(wired) == 2 and len(wired[1]) == 1, (node["name"], wired)
            found[node["name"]] = nodes[wired[1][0]]
    return found


CALLBACK_URL = r"=\{\{ \$\('Webhook'\)\.first\(\)\.json\.body\.callback\.%s \}\}"
BEARER = r"=Bearer \{\{ \$\('Webhook'\)\.first\(\)\.json\.body\.callback\.token \}\}"


def assert_posts_to_the_callback(node: dict[str, Any], url_field: str, body_key: str) -> None:
    """An HTTP Request node POSTing ``{body_key: ...}`` to ``callback.<url_field>`` with the
    callback token as a Bearer token."""
    assert node["type"] == HTTP_TYPE, node["type"]
    params = node["parameters"]
    assert params["method"] == "POST"
    assert re.fullmatch(CALLBACK_URL % url_field, params["url"]), params["url"]
    assert params["sendHeaders"] is True
    headers = {h["name"]: h["value"] for h in params["headerParameters"]["parameters"]}
    assert re.fullmatch(BEARER, headers["Authorization"]), headers
    assert params["sendBody"] is True and params["specifyBody"] == "json"
    assert f"{body_key}:" in params["jsonBody"], params["jsonBody"]


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
    # every node is on the path from the webhook, or the one node of an error branch from it
    reached = [n["name"] for n in chain(workflow)]
    reached += [n["name"] for n in error_branches(workflow).values()]
    assert sorted(reached) == sorted(names)


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
    assert next_nodes(workflow, last["name"]) == []
    assert_posts_to_the_callback(last, "complete_url", "result")
    assert "$json" in last["parameters"]["jsonBody"]


def test_the_work_nodes_error_output_posts_the_error_to_the_fail_url(
    workflow: dict[str, Any]
) -> None:
    nodes = chain(workflow)
    work = nodes[2:-1]  # between the Respond to Webhook node and the completion report
    assert work, "no work node"
    branches = error_branches(workflow)
    assert sorted(branches) == sorted(n["name"] for n in work), "a work node lacks an error branch"
    for node in work:
        # n8n's node setting, on the node itself: a parameter of that name would do nothing
        assert node["onError"] == "continueErrorOutput", node["name"]
        assert "onError" not in node["parameters"]
        report = branches[node["name"]]
        assert_posts_to_the_callback(report, "fail_url", "error")
        # the error output's items carry the node's error message as json.error
        assert report["parameters"]["jsonBody"] == "={{ JSON.stringify({ error: $json.error }) }}"
        assert next_nodes(workflow, report["name"]) == []
        assert report["name"] not in [n["name"] for n in nodes]
    # only the work may fail over to the fail URL: a failed report is not the run failing
    for node in (*nodes[:2], nodes[-1]):
        assert "onError" not in node and len(outputs(workflow, node["name"])) <= 1


def test_the_docs_describe_this_shape(workflow: dict[str, Any]) -> None:
    docs = DOCS.read_text("utf-8")
    assert f"src/veracity/examples/{EXAMPLE}" in docs
    for phrase in ('responseMode: "responseNode"', EXECUTION_ID_ANSWER, "callback.complete_url",
                   "Authorization: Bearer <callback.token>", "**Webhook** (POST, path `fulfil`)",
                   "**Respond to Webhook**", "**HTTP Request**", "callback.fail_url",
                   'onError: "continueErrorOutput"', "{{ JSON.stringify({ error: $json.error }) }}",
                   "*On Error*: *Continue (using error output)*"):
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
    assert {".callback.complete_url", ".callback.fail_url", ".callback.token"} <= paths, paths
    for path in paths:
        value: Any = body
        for key in path.strip(".").split("."):
            assert isinstance(value, dict) and key in value, (path, body)
            value = value[key]
        assert value not in (None, ""), path
