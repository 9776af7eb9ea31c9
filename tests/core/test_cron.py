"""Cron schedules and the slot decision (veracity.core.cron): which instants a schedule
fires at, across DST changes in zones of both hemispheres, with and without seconds; which
slots one decision fires or skips; and every bad ``[[cron]]`` entry."""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter

from veracity.core.cron import (
    CATCH_UP_LIMIT,
    MISSED_AFTER,
    MISSED_COUNT_LIMIT,
    Due,
    InvalidSchedule,
    Schedule,
    decide,
    parse_cron_entries,
)
from veracity.core.params import ParamsShape
from veracity.errors import ConfigError

S = timedelta(seconds=1)
M = timedelta(minutes=1)


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0,
        microsecond: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, microsecond, tzinfo=UTC)


def walk(schedule: Schedule, start: datetime, end: datetime) -> list[datetime]:
    out: list[datetime] = []
    t = start
    while True:
        found = schedule.next_after(t)
        if found is None or found > end:
            return out
        assert found > t
        out.append(found)
        t = found


# --- expressions -----------------------------------------------------------------------


def test_five_fields_fire_on_whole_minutes() -> None:
    s = Schedule("*/15 * * * *")
    assert not s.has_seconds
    assert walk(s, utc(2030, 1, 1, 0, 7, 30), utc(2030, 1, 1, 1, 0)) == [
        utc(2030, 1, 1, 0, 15), utc(2030, 1, 1, 0, 30), utc(2030, 1, 1, 0, 45),
        utc(2030, 1, 1, 1, 0)]


def test_six_fields_have_the_seconds_first() -> None:
    # croniter's default reads a sixth field as seconds at the END ("* * * * * 15" is
    # second 15); Veracity's sixth field is a leading seconds field
    s = Schedule("15 * * * * *")
    assert s.has_seconds
    assert walk(s, utc(2030, 1, 1), utc(2030, 1, 1, 0, 3)) == [
        utc(2030, 1, 1, 0, 0, 15), utc(2030, 1, 1, 0, 1, 15), utc(2030, 1, 1, 0, 2, 15)]
    # seconds first, then minute 30 of hour 2
    assert Schedule("10 30 2 * * *").next_after(utc(2030, 1, 1)) == utc(2030, 1, 1, 2, 30, 10)
    every = Schedule("* * * * * *")
    assert walk(every, utc(2030, 1, 1, 0, 0, 0, 500000), utc(2030, 1, 1, 0, 0, 3)) == [
        utc(2030, 1, 1, 0, 0, 1), utc(2030, 1, 1, 0, 0, 2), utc(2030, 1, 1, 0, 0, 3)]


def test_next_after_is_strictly_after_and_ignores_sub_seconds() -> None:
    s = Schedule("*/5 * * * * *")
    assert s.next_after(utc(2030, 1, 1, 0, 0, 5)) == utc(2030, 1, 1, 0, 0, 10)
    assert s.next_after(utc(2030, 1, 1, 0, 0, 4, 999999)) == utc(2030, 1, 1, 0, 0, 5)
    # the same answers however the calls are ordered (the cursor is only a cache)
    assert s.next_after(utc(2030, 6, 1)) == utc(2030, 6, 1, 0, 0, 5)
    assert s.next_after(utc(2030, 1, 1, 0, 0, 5)) == utc(2030, 1, 1, 0, 0, 10)


def test_whitespace_is_normalised_and_names_are_accepted() -> None:
    s = Schedule("  0   9 * JAN-MAR  MON-FRI ")
    assert s.expression == "0 9 * JAN-MAR MON-FRI"
    assert s.next_after(utc(2030, 1, 1)) == utc(2030, 1, 1, 9)  # a Tuesday
    assert Schedule("0 0 L * *").next_after(utc(2030, 2, 1)) == utc(2030, 2, 28)


@pytest.mark.parametrize(("expression", "words"), [
    ("61 * * * *", ["minute '61' is not valid", "0-59"]),
    ("* 24 * * *", ["hour '24' is not valid", "0-23"]),
    ("* * 0 * *", ["day of month '0' is not valid"]),
    ("* * * 13 *", ["month '13' is not valid"]),
    ("* * * * 8", ["day of week '8' is not valid"]),
    ("60 * * * * *", ["second '60' is not valid"]),
    ("*/0 * * * *", ["minute '*/0' is not valid"]),
    ("a * * * *", ["minute 'a' is not valid"]),
    ("0 0 30 2 *", ["not a valid cron expression", "can never occur"]),
    ("* * * *", ["has 4 fields", "expected 5", "6 with a leading seconds field"]),
    ("0 0 1 1 * 0 2030", ["has 7 fields"]),
    ("@hourly", ["has 1 field:"]),
    ("", ["has 0 fields"]),
    (",".join(["1"] * 600) + " * * * *", ["longer than 1000 characters"]),
    ("R * * * *", ["random (R) and hashed (H)", "every server"]),
    ("H/5 * * * *", ["random (R) and hashed (H)"]),
    ("0 R(1-5) * * *", ["hour 'R(1-5)'", "random"]),
])
def test_a_bad_expression_says_what_is_wrong(expression: str, words: list[str]) -> None:
    with pytest.raises(InvalidSchedule) as caught:
        Schedule(expression)
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))


def test_month_and_day_names_are_not_taken_for_random_values() -> None:
    # MAR and THU hold the letters R and H; only a value that IS R or H is refused
    assert Schedule("0 0 * MAR THU").next_after(utc(2030, 3, 1)) == utc(2030, 3, 7)


@pytest.mark.parametrize("name", ["Mars/Olympus_Mons", "utc+2", "../etc/passwd", "", " "])
def test_an_unknown_time_zone_is_refused(name: str) -> None:
    with pytest.raises(InvalidSchedule, match="time zone"):
        Schedule("* * * * *", name)


# --- time zones and DST ----------------------------------------------------------------


def test_a_zone_moves_the_wall_clock() -> None:
    s = Schedule("0 9 * * *", "Asia/Tokyo")
    assert s.next_after(utc(2029, 12, 31, 12)) == utc(2030, 1, 1, 0)  # 09:00 at +09:00
    ny = Schedule("0 9 * * *", "America/New_York")
    assert ny.next_after(utc(2030, 1, 1)) == utc(2030, 1, 1, 14)  # EST, -05:00
    assert ny.next_after(utc(2030, 7, 1)) == utc(2030, 7, 1, 13)  # EDT, -04:00


# Berlin 2024: 02:00 -> 03:00 on 31 March (01:00Z), 03:00 -> 02:00 on 27 October (01:00Z)
SPRING = utc(2024, 3, 31, 1)
AUTUMN = utc(2024, 10, 27, 1)


def test_a_fixed_time_the_clock_skips_fires_once_when_the_clock_jumps() -> None:
    s = Schedule("30 2 * * *", "Europe/Berlin")
    assert not s.follows_clock
    assert walk(s, utc(2024, 3, 29, 12), utc(2024, 4, 1, 12)) == [
        utc(2024, 3, 30, 1, 30),  # 02:30 CET
        SPRING,                   # no 02:30 that night: at the jump (03:00 CEST)
        utc(2024, 4, 1, 0, 30),   # 02:30 CEST
    ]
    # several skipped times of one night still fire once
    each = Schedule("0,20,40 2 * * *", "Europe/Berlin")
    assert walk(each, utc(2024, 3, 30, 12), utc(2024, 3, 31, 12)) == [SPRING]
    # a skipped time and a real one at the jump: once
    both = Schedule("0 0-3 * * *", "Europe/Berlin")
    assert walk(both, utc(2024, 3, 30, 22), utc(2024, 3, 31, 3)) == [
        utc(2024, 3, 30, 23), utc(2024, 3, 31, 0), SPRING]


def test_a_fixed_time_the_clock_shows_twice_fires_once() -> None:
    s = Schedule("30 2 * * *", "Europe/Berlin")
    # croniter alone (aware times) would fire 02:30 CEST and 02:30 CET
    assert walk(s, utc(2024, 10, 26, 12), utc(2024, 10, 28, 12)) == [
        utc(2024, 10, 27, 0, 30),  # 02:30 CEST, the first time
        utc(2024, 10, 28, 1, 30),  # 02:30 CET the next day
    ]


def test_a_schedule_that_follows_the_clock_skips_and_repeats_with_it() -> None:
    half = Schedule("*/30 * * * *", "Europe/Berlin")
    assert half.follows_clock
    assert walk(half, utc(2024, 3, 30, 23, 45), utc(2024, 3, 31, 1, 45)) == [
        utc(2024, 3, 31, 0), utc(2024, 3, 31, 0, 30),  # 01:00, 01:30 CET
        utc(2024, 3, 31, 1), utc(2024, 3, 31, 1, 30),  # 03:00, 03:30 CEST
    ]
    hourly = Schedule("0 * * * *", "Europe/Berlin")
    assert walk(hourly, utc(2024, 10, 26, 22, 30), utc(2024, 10, 27, 3)) == [
        utc(2024, 10, 26, 23), utc(2024, 10, 27, 0),  # 01:00, 02:00 CEST
        utc(2024, 10, 27, 1), utc(2024, 10, 27, 2),   # 02:00 again (CET), 03:00 CET
        utc(2024, 10, 27, 3)]
    # a minute field starting with * follows the clock even at a fixed hour
    night = Schedule("*/20 2 * * *", "Europe/Berlin")
    assert walk(night, utc(2024, 10, 26, 22), utc(2024, 10, 27, 22)) == [
        utc(2024, 10, 27, 0), utc(2024, 10, 27, 0, 20), utc(2024, 10, 27, 0, 40),
        utc(2024, 10, 27, 1), utc(2024, 10, 27, 1, 20), utc(2024, 10, 27, 1, 40)]
    assert walk(night, utc(2024, 3, 30, 22), utc(2024, 3, 31, 22)) == []  # 02:xx skipped


def test_a_seconds_schedule_across_the_clock_going_back() -> None:
    # New York, 3 November 2024: 02:00 EDT -> 01:00 EST at 06:00Z
    s = Schedule("58 * * * * *", "America/New_York")
    assert walk(s, utc(2024, 11, 3, 5, 58, 50), utc(2024, 11, 3, 6, 2)) == [
        utc(2024, 11, 3, 5, 58, 58), utc(2024, 11, 3, 5, 59, 58),  # 01:58:58, 01:59:58 EDT
        utc(2024, 11, 3, 6, 0, 58), utc(2024, 11, 3, 6, 1, 58)]    # 01:00:58, 01:01:58 EST
    every = Schedule("* * * * * *", "America/New_York")
    assert walk(every, utc(2024, 11, 3, 5, 59, 58), utc(2024, 11, 3, 6, 0, 2)) == [
        utc(2024, 11, 3, 5, 59, 59), utc(2024, 11, 3, 6), utc(2024, 11, 3, 6, 0, 1),
        utc(2024, 11, 3, 6, 0, 2)]
    # a fixed second of a fixed minute of the repeated hour: the first time only
    fixed = Schedule("30 15 1 * * *", "America/New_York")
    assert walk(fixed, utc(2024, 11, 3, 4), utc(2024, 11, 3, 8)) == [utc(2024, 11, 3, 5, 15, 30)]


ZONES = ["Europe/Berlin", "America/New_York", "Australia/Sydney", "Europe/Dublin",
         "Australia/Lord_Howe", "America/Sao_Paulo", "UTC", "Asia/Kolkata"]
SCHEDULES = ["30 2 * * *", "*/30 * * * *", "0 * * * *", "*/20 2 * * *", "0 1-3 * * *",
             "45 1,2 * * *", "15 */2 * * *", "0 0 * * *", "59 * * * *", "10,40 2 1-31 * *"]


def transitions(zone: str, year: int) -> list[datetime]:
    """The instants of ``year`` at which ``zone``'s offset changes (found minute by minute
    from hourly samples; independent of the code under test)."""
    tz = ZoneInfo(zone)
    found = []
    t = datetime(year, 1, 1, tzinfo=UTC)
    previous = t.astimezone(tz).utcoffset()
    while t.year == year:
        nxt = t + timedelta(hours=1)
        offset = nxt.astimezone(tz).utcoffset()
        if offset != previous:
            m = t
            while (m + M).astimezone(tz).utcoffset() == previous:
                m += M
            found.append(m + M)
            previous = offset
        t = nxt
    return found


def expected_slots(expression: str, zone: str, start: datetime, end: datetime
                   ) -> list[datetime]:
    """docs/cron.md's rule, by brute force over every minute in (start, end]: the wall
    times croniter names (naive, no DST), each instant's wall time read off zoneinfo."""
    tz = ZoneInfo(zone)
    fields = expression.split()
    follows = fields[0].startswith("*") or fields[1].startswith("*")
    first_wall = start.astimezone(tz).replace(tzinfo=None) - timedelta(hours=3)
    last_wall = end.astimezone(tz).replace(tzinfo=None) + timedelta(hours=3)
    it = croniter(expression, first_wall)
    named = set()
    while True:
        w = it.get_next(datetime)
        if w > last_wall:
            break
        named.add(w)
    out = []
    t = start + M
    while t <= end:
        local = t.astimezone(tz)
        wall = local.replace(tzinfo=None, fold=0)
        before = (t - M).astimezone(tz)
        if before.utcoffset() != local.utcoffset() and local.utcoffset() > before.utcoffset():  # type: ignore[operator]
            # the clock jumped forward at t: the wall times it skipped
            skipped = [w for w in named
                       if before.replace(tzinfo=None) < w < wall]
            if (skipped and not follows) or wall in named:
                out.append(t)
                t += M
                continue
        repeated = wall.replace(tzinfo=tz, fold=0).utcoffset() != \
            wall.replace(tzinfo=tz, fold=1).utcoffset()
        if wall in named and (not repeated or local.fold == 0 or follows):
            out.append(t)
        t += M
    return out


@pytest.mark.parametrize("zone", ZONES)
def test_every_change_of_a_year_against_brute_force(zone: str) -> None:
    changes = transitions(zone, 2024) or [utc(2024, 6, 1)]
    for change, expression in itertools.product(changes, SCHEDULES):
        start, end = change - timedelta(hours=30), change + timedelta(hours=30)
        s = Schedule(expression, zone)
        got = walk(s, start, end)
        assert got == expected_slots(expression, zone, start, end), (zone, change, expression)
        # the last slot at or before any moment agrees with the walk
        rng = random.Random(f"{zone}{change}{expression}")
        for _ in range(15):
            t = start + timedelta(seconds=rng.randrange(int((end - start).total_seconds())))
            before = [x for x in got if x <= t]
            expected = before[-1] if before else None
            assert s.latest_at_or_before(t, start) == expected, (zone, expression, t)


def test_seconds_schedules_at_each_berlin_change() -> None:
    for expression, change in itertools.product(
            ["*/10 * * * * *", "0 30 2 * * *", "*/15 59 1,2 * * *"], [SPRING, AUTUMN]):
        s = Schedule(expression, "Europe/Berlin")
        got = walk(s, change - timedelta(hours=2), change + timedelta(hours=2))
        assert got == sorted(set(got))
        for x in got:
            wall = x.astimezone(ZoneInfo("Europe/Berlin")).replace(tzinfo=None)
            if x != SPRING:  # the jump itself stands for skipped wall times
                assert croniter.match(expression, wall, second_at_beginning=True,
                                      precision_in_seconds=1), (expression, x)
    assert walk(Schedule("0 30 2 * * *", "Europe/Berlin"), SPRING - timedelta(hours=2),
                AUTUMN + timedelta(hours=2))[0] == SPRING


def test_latest_at_or_before() -> None:
    s = Schedule("0 3 * * *")
    assert s.latest_at_or_before(utc(2030, 1, 5, 12)) == utc(2030, 1, 5, 3)
    assert s.latest_at_or_before(utc(2030, 1, 5, 3)) == utc(2030, 1, 5, 3)  # at t counts
    assert s.latest_at_or_before(utc(2030, 1, 5, 2, 59, 59)) == utc(2030, 1, 4, 3)
    assert s.latest_at_or_before(utc(2030, 1, 5, 12), utc(2030, 1, 5, 3)) is None
    leap = Schedule("0 0 29 2 *")
    assert leap.latest_at_or_before(utc(2031, 1, 1)) == utc(2028, 2, 29)


# --- the decision ----------------------------------------------------------------------

T0 = utc(2030, 1, 1)


def test_nothing_due() -> None:
    s = Schedule("0 * * * *")
    hour = T0 + timedelta(hours=1)
    assert decide(s, after=T0, now=T0 + timedelta(minutes=59), catch_up=False) == Due(
        next=hour)
    assert decide(s, after=T0, now=T0, catch_up=True) == Due(next=hour)
    assert decide(s, after=T0 + S, now=T0, catch_up=True).fire == ()  # after in the future
    assert decide(s, after=T0, now=hour, catch_up=True, first=None) == Due()  # no slot left


def test_on_time_slots_all_fire() -> None:
    s = Schedule("* * * * * *")
    d = decide(s, after=T0, now=T0 + 3 * S + timedelta(milliseconds=200), catch_up=False)
    assert d.fire == (T0 + S, T0 + 2 * S, T0 + 3 * S)
    assert (d.skipped, d.missed, d.next) == (0, (), T0 + 4 * S)
    # a late tick: still within MISSED_AFTER, nothing is missed
    d = decide(s, after=T0, now=T0 + MISSED_AFTER, catch_up=False)
    assert len(d.fire) == MISSED_AFTER // S and d.skipped == 0


def test_after_downtime_only_the_latest_missed_slot_fires() -> None:
    s = Schedule("*/5 * * * *")
    now = T0 + timedelta(hours=1, minutes=2)  # no slot on time: 01:00 is 2 minutes old
    d = decide(s, after=T0, now=now, catch_up=False)
    assert d.fire == (T0 + timedelta(hours=1),) and d.missed == d.fire
    assert d.skipped == 11 and not d.skipped_more  # 00:05 .. 00:55
    # a slot on time: the missed ones are all skipped
    now = T0 + timedelta(hours=1, seconds=10)
    d = decide(s, after=T0, now=now, catch_up=False)
    assert d.fire == (T0 + timedelta(hours=1),) and d.missed == ()
    assert d.skipped == 11


def test_with_catch_up_every_missed_slot_fires_in_order() -> None:
    s = Schedule("*/5 * * * *")
    now = T0 + timedelta(hours=1, seconds=10)
    d = decide(s, after=T0, now=now, catch_up=True)
    assert d.fire == tuple(T0 + timedelta(minutes=5 * i) for i in range(1, 13))
    assert len(d.missed) == 11 and d.skipped == 0


def test_catch_up_is_bounded() -> None:
    s = Schedule("* * * * *")
    now = T0 + timedelta(minutes=500, seconds=40)  # 500 missed, none on time
    d = decide(s, after=T0, now=now, catch_up=True)
    assert len(d.fire) == CATCH_UP_LIMIT
    assert d.fire == tuple(T0 + timedelta(minutes=i) for i in range(401, 501))
    assert d.skipped == 400 and not d.skipped_more


def test_counting_is_bounded_and_the_latest_are_found_backwards() -> None:
    s = Schedule("* * * * * *")
    now = T0 + timedelta(hours=5)
    deadline = now - MISSED_AFTER
    for catch_up in (False, True):
        d = decide(s, after=T0, now=now, catch_up=catch_up)
        assert d.skipped == MISSED_COUNT_LIMIT and d.skipped_more
        on_time = [deadline + i * S for i in range(1, 31)]
        if catch_up:
            assert list(d.fire) == [deadline - i * S for i in range(99, -1, -1)] + on_time
        else:
            assert list(d.fire) == on_time
    sparse = Schedule("0 * * * *")  # counted exactly: 23 missed, the latest fires
    d = decide(sparse, after=T0, now=T0 + timedelta(hours=24, minutes=10), catch_up=False)
    assert d.fire == (T0 + timedelta(hours=24),) and d.skipped == 23


def test_nothing_at_or_before_after_fires() -> None:
    s = Schedule("* * * * * *")
    d = decide(s, after=T0 + 2 * S, now=T0 + 4 * S, catch_up=True)
    assert d.fire == (T0 + 3 * S, T0 + 4 * S)


def test_decisions_over_random_histories_match_the_rule() -> None:
    rng = random.Random(8)
    for _ in range(200):
        expression = rng.choice(["* * * * * *", "*/7 * * * * *", "*/2 * * * *", "0 * * * *"])
        s = Schedule(expression)
        after = T0 + timedelta(seconds=rng.randrange(0, 7200))
        # spans around MISSED_AFTER, and past the count limit for the dense schedules
        now = after + timedelta(seconds=rng.choice([rng.randrange(0, 90),
                                                    rng.randrange(0, 2400)]))
        catch_up = rng.random() < 0.5
        due = walk(s, after, now)
        deadline = now - MISSED_AFTER
        on_time = [x for x in due if x > deadline]
        missed = [x for x in due if x <= deadline]
        if catch_up:
            fire = missed[-CATCH_UP_LIMIT:] + on_time
        else:
            fire = on_time or missed[-1:]
        d = decide(s, after=after, now=now, catch_up=catch_up)
        assert list(d.fire) == fire, (expression, after, now, catch_up)
        if len(missed) <= MISSED_COUNT_LIMIT + CATCH_UP_LIMIT:
            assert d.skipped == len(due) - len(fire) and not d.skipped_more
        assert d.next == s.next_after(now)
        # told the first slot after ``after``, it decides the same
        hinted = decide(s, after=after, now=now, catch_up=catch_up, first=s.next_after(after))
        assert hinted == d


# --- [[cron]] entries ------------------------------------------------------------------

FLOWS = {"app:jobs/report.run", "app:jobs/sync.run"}


def entry(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {"name": "worker_reconcile", "ffqn": "app:jobs/report.run",
                               "schedule": "* * * * *"}
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def test_an_entry_and_its_defaults() -> None:
    (e,) = parse_cron_entries([entry()], workflows=FLOWS)
    assert (e.name, e.ffqn, e.expression, e.timezone, e.params, e.catch_up) == (
        "worker_reconcile", "app:jobs/report.run", "* * * * *", "UTC", (), False)
    (e,) = parse_cron_entries([entry(params=[1, "a", {"b": [True, None]}], catch_up=True,
                                     timezone="Europe/Berlin", schedule="5 0 3 * * *")],
                              workflows=FLOWS)
    assert e.params == (1, "a", {"b": [True, None]}) and e.catch_up
    assert e.schedule.has_seconds and e.timezone == "Europe/Berlin"
    assert parse_cron_entries([], workflows=FLOWS) == []


@pytest.mark.parametrize(("entries", "message"), [
    ([entry(schedule="61 * * * *")],
     'cron[worker_reconcile]: schedule "61 * * * *": minute \'61\' is not valid'),
    ([entry(schedule=5)], "cron[worker_reconcile]: schedule 5: must be a string"),
    ([entry(schedule=None)], "cron[worker_reconcile]: schedule is required"),
    ([entry(ffqn="app:jobs/nothing.run")],
     'cron[worker_reconcile]: ffqn "app:jobs/nothing.run": unknown workflow: neither '
     "registered by the app nor an [[external_workflow]] (known: app:jobs/report.run, "
     "app:jobs/sync.run)"),
    ([entry(ffqn="not a name")], 'cron[worker_reconcile]: ffqn "not a name": '),
    ([entry(ffqn=None)], "cron[worker_reconcile]: ffqn is required"),
    ([entry(timezone="Mars/Olympus_Mons")],
     'cron[worker_reconcile]: timezone "Mars/Olympus_Mons": unknown time zone'),
    ([entry(timezone=3)], "cron[worker_reconcile]: timezone 3: "),
    ([entry(), entry(schedule="0 * * * *")],
     "cron[worker_reconcile]: the name is taken by cron #1"),
    ([entry(params="[1, 2]")],
     "cron[worker_reconcile]: params must be a list (the workflow's positional parameters, "
     "JSON values), got a string"),
    ([entry(params={"a": 1})], "cron[worker_reconcile]: params must be a list"),
    ([entry(params=[datetime(2030, 1, 1)])],
     "cron[worker_reconcile]: params must be JSON values"),
    ([entry(params=[float("nan")])], "cron[worker_reconcile]: params must be JSON values"),
    ([entry(retries=3)],
     "cron[worker_reconcile]: unknown key retries (an entry has catch_up, ffqn, name, "
     "params, schedule, timezone)"),
    ([entry(retries=3, every="1m")], "cron[worker_reconcile]: unknown keys every, retries"),
    ([entry(catch_up="yes")], 'cron[worker_reconcile]: catch_up must be true or false, '
                              'got "yes"'),
    ([entry(name=None)], "cron #1: name is required"),
    ([entry(), entry(name="has space")], 'cron #2: name "has space": 1 to 100 letters'),
    (["* * * * *"], "cron #1: expected a table"),
])
def test_a_bad_entry_names_itself(entries: list[object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_cron_entries(entries, workflows=FLOWS)
    assert str(caught.value).startswith(message), str(caught.value)


async def _report(ctx: object, day: str, team: str = "all") -> None: ...


async def _sync(ctx: object, *, source: str) -> None: ...


SHAPES = {"app:jobs/report.run": ParamsShape.of(_report),
          "app:jobs/sync.run": ParamsShape.of(_sync)}


@pytest.mark.parametrize(("changes", "message"), [
    ({"params": []}, "cron[worker_reconcile]: params do not fit workflow app:jobs/report.run: "
                     "it takes 1 to 2 params (day, team='all'); got 0: missing day"),
    ({"params": ["2030-01-01", "ops", 3]},
     "cron[worker_reconcile]: params do not fit workflow app:jobs/report.run: it takes 1 to "
     "2 params (day, team='all'); got 3"),
    ({"ffqn": "app:jobs/sync.run", "params": ["x"]},
     "cron[worker_reconcile]: params do not fit workflow app:jobs/sync.run: it requires "
     "keyword-only parameter(s) source without a default, which params (positional) cannot "
     "give; its parameters: (*, source)"),
])
def test_params_that_do_not_fit_the_workflow(changes: dict[str, object], message: str) -> None:
    shapes = {k: v for k, v in SHAPES.items() if v is not None}
    with pytest.raises(ConfigError) as caught:
        parse_cron_entries([entry(name="first", params=["2030-01-01"]), entry(**changes)],
                           workflows=FLOWS, shapes=shapes)
    assert str(caught.value) == message


def test_params_that_fit_or_are_not_checked() -> None:
    shapes = {k: v for k, v in SHAPES.items() if v is not None}
    fit = parse_cron_entries([entry(name="a", params=["2030-01-01"]),
                              entry(name="b", params=["2030-01-01", "ops"])],
                             workflows=FLOWS, shapes=shapes)
    assert [e.params for e in fit] == [("2030-01-01",), ("2030-01-01", "ops")]
    # a workflow without a shape (an [[external_workflow]]'s) is not checked
    (other,) = parse_cron_entries([entry(ffqn="app:jobs/sync.run", params=[1, 2, 3])],
                                  workflows=FLOWS, shapes={"app:jobs/report.run":
                                                           shapes["app:jobs/report.run"]})
    assert other.params == (1, 2, 3)


def test_params_over_the_payload_limit() -> None:
    with pytest.raises(ConfigError, match=r"cron\[big\]: params are 5004 bytes; the limit is "
                                          r"max_payload_bytes = 4096"):
        parse_cron_entries([entry(name="big", params=["x" * 5000])], workflows=FLOWS,
                           max_payload_bytes=4096)
