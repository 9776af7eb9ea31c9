"""The ``veracity`` command line.

``veracity --version`` answers without loading the commands (and what they import: the
store, the API's schemas, the engines); everything else loads them
(:mod:`veracity.cli.main`).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from veracity.cli.main import cli

__all__ = ["cli", "main"]


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        from importlib.metadata import version

        # as click's version option prints it (veracity.cli.main), without the import
        print(f"veracity, version {version('veracity')}")
        return
    from veracity.cli.main import main as run

    run()


def __getattr__(name: str) -> Any:
    if name == "cli":
        from veracity.cli.main import cli

        return cli
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
