"""Loading a document's code as a module, the way a reader would save and import it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def run_as_module(name: str, code: str, folder: Path) -> ModuleType:
    """``code`` written to ``folder/name.py`` and imported as module ``name`` (in
    ``sys.modules`` while it runs, so that its dataclasses and the like resolve)."""
    path = folder / f"{name}.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)
    return module
