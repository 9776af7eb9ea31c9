"""The public surface of ``import veracity``: exactly ``__all__``, each name loading on
first use from the module that defines it (so importing the package stays quick)."""

from __future__ import annotations

import subprocess
import sys
import types

import veracity


def test_the_public_names_are_exactly_all() -> None:
    assert sorted(veracity.__all__) == sorted(veracity._WHERE)
    for name in veracity.__all__:
        value = getattr(veracity, name)
        assert value.__module__ == veracity._WHERE[name], name
    public = {n for n in dir(veracity) if not n.startswith("_")
              and not isinstance(getattr(veracity, n), types.ModuleType)}
    assert public - {"annotations", "import_module", "TYPE_CHECKING", "Any"} == set(
        veracity.__all__)


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        veracity.Nope  # noqa: B018
    except AttributeError as exc:
        assert "Nope" in str(exc)
    else:
        raise AssertionError("no AttributeError")


def test_importing_veracity_loads_neither_the_server_nor_the_database_drivers() -> None:
    code = ("import sys, veracity; from veracity import App, Context, Client; "
            "print(sorted(m for m in ('psycopg', 'fastapi', 'uvicorn', 'veracity.store', "
            "'veracity.worker.runner', 'aiohttp') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout
