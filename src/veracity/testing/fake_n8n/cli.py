"""The command line: ``python -m veracity.testing.fake_n8n`` serves one fake n8n in the
foreground (:func:`main`).
"""

from __future__ import annotations

import argparse

import uvicorn

from veracity.testing.fake_n8n.engine import FakeN8n
from veracity.testing.fake_n8n.web import create_app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m veracity.testing.fake_n8n", description="Run a fake n8n."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5678)
    parser.add_argument("--version", default="1.123", help="n8n version to imitate (1.x, 2.x)")
    parser.add_argument("--api-key", default="fake-n8n-api-key")
    parser.add_argument("--email", default="owner@example.com")
    parser.add_argument("--password", default="fake-n8n-password")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added per request")
    parser.add_argument(
        "--migrating-for",
        type=float,
        default=0.0,
        metavar="S",
        help="for S seconds from launch, answer 200 'n8n is starting up. Please wait'",
    )
    parser.add_argument(
        "--starting-for",
        type=float,
        default=0.0,
        metavar="S",
        help="then for S seconds, answer 404 'Cannot <METHOD> <path>' (no route mounted yet)",
    )
    parser.add_argument(
        "--webhook",
        action="append",
        default=[],
        metavar="PATH",
        help="register a production webhook with the default script (repeatable)",
    )
    args = parser.parse_args(argv)
    fake = FakeN8n(
        version=args.version,
        api_key=args.api_key,
        email=args.email,
        password=args.password,
        latency=args.latency,
        migrating_for=args.migrating_for,
        starting_for=args.starting_for,
    )
    for path in args.webhook:
        fake.add_webhook(path)
    print(
        f"fake n8n {fake.version} listening on http://{args.host}:{args.port}",
        flush=True,
    )
    uvicorn.run(
        create_app(fake),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        ws="none",
        timeout_graceful_shutdown=2,
    )
