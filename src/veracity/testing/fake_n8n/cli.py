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
        prog="python -m veracity.testing.fake_n8n",
        description="Run a fake n8n: its production webhooks, its executions API (API key) "
                    "and its stop endpoints (API key, or the 1.x session login), as "
                    "Veracity uses them (docs/external.md).",
        epilog="Register a webhook with --webhook PATH (or POST /_fake/webhooks "
               '{"path": PATH}); each trigger of /webhook/PATH starts a run that works for '
               "0.2 s, then calls the trigger's callback.complete_url back. Point Veracity "
               "at it with [engines.n8n] base_url = http://HOST:PORT and api_key_env, "
               "login_email_env, login_password_env naming variables that hold the values "
               "of --api-key, --email and --password (defaults shown). Example: python -m "
               "veracity.testing.fake_n8n --port 5678 --webhook fulfil",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=5678, help="port to listen on")
    parser.add_argument("--version", default="1.123", help="n8n version to imitate (1.x, 2.x)")
    parser.add_argument("--api-key", default="fake-n8n-api-key",
                        help="the X-N8N-API-KEY its API takes")
    parser.add_argument("--email", default="owner@example.com",
                        help="the login of its session stop (n8n 1.x)")
    parser.add_argument("--password", default="fake-n8n-password",
                        help="the password of that login")
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
