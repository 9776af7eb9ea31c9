"""A test that needs something the developer loop provides (PostgreSQL's server binaries,
which the README requires; libfaketime, a development dependency that `make` installs):
where it is missing the test fails, saying what to install. It is never skipped."""

from __future__ import annotations

from typing import NoReturn

import pytest


def missing(what: str) -> NoReturn:
    pytest.fail(f"{what}: install it (see README.md) and run the tests again")
