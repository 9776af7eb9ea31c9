"""The garbage collector's settings of a long-running Veracity process (docs/operations.md,
"Memory and the garbage collector").

Once started, a ``veracity worker`` or ``veracity server`` calls :func:`settle`:

- ``gc.freeze()``: what start-up made (modules, the app's workflows, the API's routes)
  lives as long as the process; frozen, the collector's full passes no longer walk it
  again and again.
- the youngest generation is collected every ``gc_young_threshold`` (default
  :data:`YOUNG`) net allocations of container objects instead of Python's 700. A busy
  worker keeps hundreds of executions in flight, each with its task, futures and
  records; their allocations and frees kept the allocation count near 700 and started a
  collection about every 20 executions: 22 to 27 % of the worker's CPU, and pauses of up
  to 38 ms, in drains of 30,000 no-ops (bench/journal.md). Garbage in reference cycles
  is still collected, later: large objects kept in cycles can hold more memory until
  then (docs/operations.md says when to lower the setting).

``gc_young_threshold = 0`` leaves the thresholds as they are. An application that set
its own (at import, before :func:`settle` runs) keeps them too: only thresholds still as
they were when Veracity was imported are changed.
"""

from __future__ import annotations

import gc

YOUNG = 10_000
"""Net allocations of container objects between collections of the youngest generation:
the default of the ``gc_young_threshold`` setting."""

_DEFAULT = gc.get_threshold()
"""The thresholds when Veracity was imported: the interpreter's, unless something imported
before Veracity changed them."""


def settle(young: int = YOUNG) -> None:
    """Freeze what start-up made, and set the youngest generation's threshold to
    ``young`` (0: leave it) if nobody changed the thresholds since Veracity's import."""
    gc.freeze()
    current = gc.get_threshold()
    if young and current == _DEFAULT:
        gc.set_threshold(young, *current[1:])
