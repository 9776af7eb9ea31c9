"""The dashboard's defences against forged posts: a same-origin check and a CSRF token.

Every form the dashboard renders carries the browser's CSRF token (a random value kept in
a SameSite=Strict cookie, the "double submit" pattern); a post is refused unless its form
field equals the cookie, its ``Origin`` (or, without one, its ``Referer``) is the
dashboard's own origin, and the browser does not call it cross-site
(``Sec-Fetch-Site``). See docs/dashboard.md.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Mapping
from urllib.parse import urlsplit

CSRF_COOKIE = "veracity_csrf"
TOKEN_COOKIE = "veracity_token"
CSRF_FIELD = "csrf"


def new_csrf_token() -> str:
    return secrets.token_urlsafe(32)


def _origin_of(url: str) -> str | None:
    parts = urlsplit(url)
    if not parts.scheme or not parts.netloc:
        return None
    return f"{parts.scheme}://{parts.netloc}".lower()


def post_refusal(*, own_origin: str, headers: Mapping[str, str],
                 cookie: str | None, field: str | None) -> str | None:
    """Why a post must be refused, or None. ``own_origin`` is ``scheme://host[:port]`` as
    the request addressed the server."""
    own = own_origin.lower()
    fetch_site = headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return f"a {fetch_site} post is refused: actions come from the dashboard's own pages"
    origin = headers.get("origin")
    if origin is not None and origin != "null":
        if origin.lower() != own:
            return (f"a post from {origin[:100]} is refused: actions come from the "
                    f"dashboard's own pages ({own})")
    elif origin == "null":
        return "a post from an opaque origin is refused"
    else:
        referer = headers.get("referer")
        if referer is not None and _origin_of(referer) != own:
            return "a post referred by another site is refused"
    if not cookie:
        return ("the form's security token is missing (cookies are needed): reload the page "
                "and try again")
    if not field:
        return "the form's security token is missing: reload the page and try again"
    if not hmac.compare_digest(cookie.encode(), field.encode()):
        return ("the form's security token does not match this browser's: reload the page "
                "and try again")
    return None
