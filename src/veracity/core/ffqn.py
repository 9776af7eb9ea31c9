"""Fully qualified function names: ``namespace:package/interface.function``."""

from __future__ import annotations

import re

MAX_FFQN_LENGTH = 512
CANCELLABLE_SUFFIX = "-cancellable"

FFQN_PATTERN = (r"^[a-z][a-z0-9_-]*:[a-z][a-z0-9_.-]*/[a-z][a-z0-9_-]*\.[a-z][a-z0-9_-]*$")
"""A well-formed name, as a regular expression (also in the OpenAPI document)."""

_FFQN = re.compile(
    r"^(?P<ns>[a-z][a-z0-9_-]*):(?P<pkg>[a-z][a-z0-9_.-]*)/(?P<iface>[a-z][a-z0-9_-]*)\."
    r"(?P<fn>[a-z][a-z0-9_-]*)\Z"
)


# every prefix of a well-formed name: "shop", "shop:", "shop:orders/", "shop:orders/pro", ...
FFQN_PREFIX_PATTERN = (
    r"^[a-z][a-z0-9_-]*(?::(?:[a-z][a-z0-9_.-]*(?:/(?:[a-z][a-z0-9_-]*"
    r"(?:\.(?:[a-z][a-z0-9_-]*)?)?)?)?)?)?$"
)
"""What some well-formed name starts with (also in the OpenAPI document)."""

_PREFIX = re.compile(FFQN_PREFIX_PATTERN[:-1] + r"\Z")


class InvalidFfqn(ValueError):
    """A workflow name that is not ``namespace:package/interface.function``."""


def validate_ffqn(ffqn: str) -> str:
    """Return ``ffqn`` unchanged if well formed, else raise :class:`InvalidFfqn`."""
    if len(ffqn) > MAX_FFQN_LENGTH:
        raise InvalidFfqn(f"workflow name is longer than {MAX_FFQN_LENGTH} characters")
    if not _FFQN.match(ffqn):
        raise InvalidFfqn(
            f"workflow name {ffqn!r} is not of the form namespace:package/interface.function "
            "(lower-case letters, digits, '-' and '_')"
        )
    return ffqn


def validate_ffqn_prefix(prefix: str) -> str:
    """Return ``prefix`` unchanged if some well-formed workflow name starts with it, else
    raise :class:`InvalidFfqn`."""
    if not prefix:
        raise InvalidFfqn("a workflow name prefix cannot be empty")
    if len(prefix) > MAX_FFQN_LENGTH:
        raise InvalidFfqn(f"workflow name prefix is longer than {MAX_FFQN_LENGTH} characters")
    if not _PREFIX.match(prefix):
        raise InvalidFfqn(
            f"{prefix!r} cannot begin a workflow name (namespace:package/interface.function: "
            "lower-case letters, digits, '-' and '_')"
        )
    return prefix


def is_cancellable(ffqn: str) -> bool:
    """Only workflows whose name ends in ``-cancellable`` may be cancelled."""
    return ffqn.endswith(CANCELLABLE_SUFFIX)
