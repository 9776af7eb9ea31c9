"""A test that needs something this machine may lack (PostgreSQL's server binaries,
libfaketime): on a developer's machine without it the test is skipped, visibly, with what
to install; under CI (``CI`` set, as `.ci/run` runs), where it must be present, it fails."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def missing(what: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"{what}: CI must provide it (see .ci/run)")
    pytest.skip(what)
