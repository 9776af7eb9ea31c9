"""The garbage collector's settings of a long-running Veracity process (docs/operations.md,
"Memory and the garbage collector").

Once started, a ``veracity worker`` or ``veracity server`` calls :func:`settle`:

- ``gc.freeze()``: what start-up made (modules, the app's workflows, the API's routes)
  lives as long as the process; frozen, the collector's full passes no longer walk it
  again and again. Before, each full pass of a busy worker took 17 to 38 ms.
- the youngest generation is collected every :data:`YOUNG` net allocations of container
  objects instead of Python's 700. A busy worker keeps hundreds of executions in flight,
  each with its task, futures and records; their allocations and frees keep the
  allocation count near 700 and started a collection about every 20 executions, about a
  seventh of the worker's CPU (1,438 to 1,480 collections, 260 to 700 ms, in drains of
  30,000 no-ops). Cyclic garbage is still collected, a little later.

An application that set its own thresholds (at import, before :func:`settle` runs) keeps
them: only the interpreter's own default is raised.
"""

from __future__ import annotations

import gc

YOUNG = 10_000
"""Net allocations of container objects between collections of the youngest generation."""

_DEFAULT = gc.get_threshold()
"""The thresholds when Veracity was imported: the interpreter's, unless something imported
before Veracity changed them."""


def settle() -> None:
    """Freeze what start-up made, and raise the youngest generation's threshold to
    :data:`YOUNG` if nobody changed it since Veracity's import (and it is lower)."""
    gc.freeze()
    current = gc.get_threshold()
    if current == _DEFAULT and current[0] < YOUNG:
        gc.set_threshold(YOUNG, *current[1:])
