"""One round trip per checkpointed step (docs/workers.md): the statements the PostgreSQL
store sends while an in-process worker runs a 1-step and an 11-step workflow, counted the
way `python -m bench.engine` counts them (bench/engine.py): ten more steps cost exactly
ten more statements, each a checkpoint sent on its own in autocommit (no multi-statement
transaction anywhere on a run's path)."""

from __future__ import annotations

from bench.engine import statements_of_a_run


async def test_each_checkpointed_step_is_one_statement(pg_url: str) -> None:
    one = await statements_of_a_run(pg_url, 1)
    eleven = await statements_of_a_run(pg_url, 11)
    assert not [n for n in one + eleven if n.startswith("transaction")], (one, eleven)
    assert len(eleven) - len(one) == 10, (one, eleven)
    extra = list(eleven)
    for name in one:
        extra.remove(name)
    assert extra == ["execution_checkpoint_many_if_owned"] * 10, (one, eleven)
