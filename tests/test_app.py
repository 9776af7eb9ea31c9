"""The App registry and loading an app by name."""

from __future__ import annotations

import sys
import textwrap
from datetime import timedelta

import pytest

import veracity
from veracity import App
from veracity.app import load_app
from veracity.errors import ConfigError


def test_public_api_is_exactly_all():
    public = {name for name in dir(veracity) if not name.startswith("_")}
    assert set(veracity.__all__) <= public
    assert "App" in veracity.__all__
    assert "Status" in veracity.__all__


def test_register_and_look_up():
    app = App()

    @app.workflow("shop:orders/process.run", timeout=30)
    async def process(ctx, order_id: str) -> str:
        return order_id

    assert "shop:orders/process.run" in app
    wf = app.get("shop:orders/process.run")
    assert wf is not None and wf.fn is process and wf.timeout == timedelta(seconds=30)
    assert list(app) == ["shop:orders/process.run"]
    assert app.get("shop:orders/other.run") is None


def test_rejects_bad_names_sync_functions_and_duplicates():
    app = App()
    with pytest.raises(ValueError, match=r"namespace:package/interface\.function"):
        app.workflow("not a name")
    with pytest.raises(TypeError, match="async"):

        @app.workflow("a:b/c.d")
        def sync_fn(ctx):  # not async
            return None

    @app.workflow("a:b/c.e")
    async def first(ctx):
        return None

    with pytest.raises(ValueError, match="registered twice"):

        @app.workflow("a:b/c.e")
        async def second(ctx):
            return None

    with pytest.raises(ValueError, match="positive"):
        app.workflow("a:b/c.f", timeout=0)


def test_upgrade_mode_pinned_by_default_or_auto():
    from veracity.core.deployments import Upgrade

    app = App()

    @app.workflow("a:b/c.pinned")
    async def pinned(ctx):
        return None

    @app.workflow("a:b/c.auto", upgrade="auto")
    async def auto(ctx):
        return None

    @app.workflow("a:b/c.explicit", upgrade="pinned")
    async def explicit(ctx):
        return None

    modes = {f: wf.upgrade for f, wf in app.workflows.items()}
    assert modes == {"a:b/c.pinned": Upgrade.PINNED, "a:b/c.auto": Upgrade.AUTO,
                     "a:b/c.explicit": Upgrade.PINNED}
    assert app.upgrading == ["a:b/c.auto"]
    for bad in ("Auto", "latest", "", None):
        with pytest.raises(ValueError, match="upgrade must be 'pinned' or 'auto'"):
            app.workflow("a:b/c.bad", upgrade=bad)  # type: ignore[arg-type]
    assert "a:b/c.bad" not in app


def test_code_digest_changes_with_code_and_names():
    a, b, c = App(), App(), App()

    @a.workflow("a:b/c.d")
    async def one(ctx):
        return 1

    @b.workflow("a:b/c.d")
    async def one_again(ctx):
        return 2

    @c.workflow("a:b/c.x")
    async def one_renamed(ctx):
        return 1

    digests = {a.code_digest(), b.code_digest(), c.code_digest()}
    assert len(digests) == 3
    assert a.code_digest() == a.code_digest()
    assert a.code_digest().startswith("d-")


def test_load_app(tmp_path, monkeypatch):
    (tmp_path / "myapp_mod.py").write_text(textwrap.dedent("""
        from veracity import App
        app = App()
        not_an_app = 3
    """))
    (tmp_path / "broken_mod.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert isinstance(load_app("myapp_mod:app"), App)
        with pytest.raises(ConfigError, match=r"not a veracity\.App"):
            load_app("myapp_mod:not_an_app")
        with pytest.raises(ConfigError, match="no attribute"):
            load_app("myapp_mod:missing")
        with pytest.raises(ConfigError, match="cannot import"):
            load_app("no_such_module_xyz:app")
        with pytest.raises(ConfigError, match="boom at import"):
            load_app("broken_mod:app")
        with pytest.raises(ConfigError, match="module:attribute"):
            load_app("just_a_module")
    finally:
        for name in ("myapp_mod", "broken_mod"):
            sys.modules.pop(name, None)
