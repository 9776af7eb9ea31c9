"""One TLS context per process for Veracity's HTTP clients.

httpx makes a new :class:`ssl.SSLContext` for every client or transport it builds without
one, reading the whole CA bundle each time (about 20 ms of CPU). Veracity's clients (the
Python client, the n8n adapter, the worker's HTTP bindings, the fake n8n) pass this one
instead: the same verification as httpx's default (certifi's bundle, or ``SSL_CERT_FILE`` /
``SSL_CERT_DIR`` where the environment is trusted), made once, when first needed. A change
to those variables after that is not seen by the running process."""

from __future__ import annotations

import functools
import ssl


@functools.cache
def ssl_context(*, trust_env: bool = True) -> ssl.SSLContext:
    """httpx's default verifying context, made once per process (per ``trust_env``)."""
    import httpx

    return httpx.create_ssl_context(trust_env=trust_env)
