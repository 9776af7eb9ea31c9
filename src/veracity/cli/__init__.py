"""The ``veracity`` command line."""

from veracity.cli.main import cli, main

__all__ = ["cli", "main"]
