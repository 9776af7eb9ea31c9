"""Store conformance: scoped API tokens (the TokenStore protocol, migration 0007), on both
backends. Only a token's digest reaches the database; rows are never deleted; a name is
never given out twice; expiry and revocation are read by the store's clock."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.store._support import DB_ERRORS, RawSQL
from veracity.clock import ManualClock
from veracity.core.tokens import Scope, new_secret
from veracity.models import NewApiToken
from veracity.store import Store


def new_token(name: str = "reconciler", *scopes: Scope,
              expires_in: timedelta | None = None) -> tuple[str, NewApiToken]:
    made = new_secret()
    return made.token, NewApiToken(
        name=name, key_id=made.key_id, token_hash=made.digest,
        scopes=tuple(scopes or (Scope.EXECUTIONS_READ,)), expires_in=expires_in)


async def test_create_records_the_digest_scopes_and_times(
    store: Store, clock: ManualClock
) -> None:
    token, new = new_token("reconciler", Scope.EXECUTIONS_READ, Scope.EXECUTIONS_CANCEL,
                           expires_in=timedelta(days=30))
    created = await store.token_create(new)
    assert created is not None
    assert created.name == "reconciler"
    assert created.key_id == new.key_id
    assert created.token_hash == new.token_hash != token
    assert created.scopes == ("executions:read", "executions:cancel")
    assert created.created_at == clock.now()
    assert created.expires_at == clock.now() + timedelta(days=30)
    assert created.revoked_at is None and created.last_used_at is None
    assert await store.token_get("reconciler") == created


async def test_create_without_a_lifetime_never_expires(store: Store) -> None:
    _, new = new_token("forever")
    created = await store.token_create(new)
    assert created is not None and created.expires_at is None


async def test_create_with_an_existing_name_writes_nothing(
    store: Store, clock: ManualClock
) -> None:
    _, first = new_token("dup", Scope.EXECUTIONS_READ)
    original = await store.token_create(first)
    clock.advance(60)
    _, second = new_token("dup", Scope.ADMIN)
    assert await store.token_create(second) is None
    assert await store.token_list() == [original]
    assert await store.token_find(second.key_id) is None


async def test_the_name_of_a_revoked_token_is_not_given_out_again(store: Store) -> None:
    _, first = new_token("old")
    await store.token_create(first)
    assert await store.token_revoke("old") is not None
    _, second = new_token("old")
    assert await store.token_create(second) is None
    listed = await store.token_list()
    assert [t.key_id for t in listed] == [first.key_id]


async def test_find_by_key_id_answers_with_the_stores_time(
    store: Store, clock: ManualClock
) -> None:
    _, new = new_token("a")
    created = await store.token_create(new)
    clock.advance(3600)
    found = await store.token_find(new.key_id)
    assert found is not None
    assert found.token == created
    assert found.now == clock.now()
    assert await store.token_find("0123456789abcdef") is None


async def test_list_is_oldest_first_and_keeps_revoked_tokens(
    store: Store, clock: ManualClock
) -> None:
    names = ["b", "a", "c"]
    for name in names:
        await store.token_create(new_token(name)[1])
        clock.advance(1)
    _, same_time = new_token("0-same-time-as-c")
    clock.advance(-1)
    await store.token_create(same_time)
    await store.token_revoke("a")
    listed = await store.token_list()
    # created_at, then name
    assert [t.name for t in listed] == ["b", "a", "0-same-time-as-c", "c"]
    assert [t.revoked_at is not None for t in listed] == [False, True, False, False]


async def test_revoke_once_then_nothing_changes(store: Store, clock: ManualClock) -> None:
    _, new = new_token("x")
    await store.token_create(new)
    clock.advance(10)
    revoked = await store.token_revoke("x")
    assert revoked is not None and revoked.revoked_at == clock.now()
    at = clock.now()
    clock.advance(10)
    assert await store.token_revoke("x") is None
    again = await store.token_get("x")
    assert again is not None and again.revoked_at == at
    assert await store.token_revoke("no-such-token") is None
    assert await store.token_get("no-such-token") is None


async def test_touch_records_the_last_use_and_only_moves_forward(
    store: Store, clock: ManualClock
) -> None:
    _, new = new_token("t")
    await store.token_create(new)
    clock.advance(5)
    await store.token_touch(new.key_id)
    first = clock.now()
    got = await store.token_get("t")
    assert got is not None and got.last_used_at == first
    clock.advance(-3)  # another server's clock a little behind
    await store.token_touch(new.key_id)
    got = await store.token_get("t")
    assert got is not None and got.last_used_at == first
    clock.advance(10)
    await store.token_touch(new.key_id)
    got = await store.token_get("t")
    assert got is not None and got.last_used_at == clock.now()
    await store.token_touch("ffffffffffffffff")  # unknown: nothing to do, no error


@pytest.mark.parametrize("field, value", [
    ("name", ""),
    ("name", "has space"),
    ("name", "-leading-dash"),
    ("name", "x" * 65),
    ("key_id", "ABCDEF0123456789"),
    ("key_id", "0123"),
    ("token_hash", "not-a-digest"),
    ("scopes", ()),
])
async def test_the_schema_refuses_malformed_rows(
    store: Store, raw: RawSQL, field: str, value: object
) -> None:
    _, good = new_token("good")
    bad = NewApiToken(**{**{f: getattr(good, f) for f in NewApiToken.__dataclass_fields__},
                         field: value})
    with pytest.raises(DB_ERRORS):
        await store.token_create(bad)
    assert raw.scalar("SELECT count(*) FROM veracity_api_tokens") == 0


async def test_the_schema_refuses_a_second_row_with_one_key_id(
    store: Store, raw: RawSQL
) -> None:
    _, first = new_token("one")
    await store.token_create(first)
    _, other = new_token("two")
    clash = NewApiToken(name="two", key_id=first.key_id, token_hash=other.token_hash,
                        scopes=other.scopes, expires_in=None)
    with pytest.raises(DB_ERRORS):
        await store.token_create(clash)
    assert raw.scalar("SELECT count(*) FROM veracity_api_tokens") == 1
