"""The bucket step in Python (``_bucket.py``, for this machine's quota files) is the
Redis script's step (``_redis.BUCKET_SCRIPT``, Lua): the same stored fields and
arguments give the same stored fields and the same reply, to the digit.

The Lua runs in fakeredis (through lupa); its reply names the time it ran, which the
Python step is given.
"""

from __future__ import annotations

import math
import time

import fakeredis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stormguard._policies.quota._bucket import bucket_step, parse_reply
from stormguard._policies.quota._redis import BUCKET_SCRIPT

KEY = "stormguard:quota:abc:def"
_FIELDS = ("tL", "tV", "tT", "rL", "rV", "rT", "nb")


@pytest.fixture(scope="module")
def server() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis(decode_responses=True)


def _g(x: float) -> str:
    return "%.17g" % x  # noqa: UP031


def _stored(now: float) -> st.SearchStrategy[dict[str, str]]:
    """A key's hash as the script leaves it, and as time or a stranger may."""
    number = st.one_of(
        st.floats(-1e6, 1e6, allow_nan=False).map(_g),  # levels, limits
        st.floats(-120, 120, allow_nan=False).map(lambda d: _g(now + d)),  # stamps
        st.sampled_from(["0", "-5", "60000", "200", "nan", "inf", "1e20", "x", "", "5e-324"]),
    )
    return st.dictionaries(st.sampled_from(_FIELDS), number, max_size=len(_FIELDS))


def _dimension() -> st.SearchStrategy[tuple[str, str, str, str]]:
    return st.tuples(
        st.one_of(st.sampled_from(["0.0", "5e-324", "0.0005"]), st.floats(1, 1e6).map(repr)),
        st.sampled_from(["0", "1"]),  # learned since the last reservation
        st.one_of(st.just(""), st.floats(-1e12, 1e12).map(repr)),  # R - rho * t
        st.floats(-1e5, 1e5).map(repr),  # given back (taken: negative)
    )


_ARGS = st.tuples(
    st.floats(0, 1e5).map(repr),  # cost
    st.floats(0, 300).map(repr),  # seconds the call has
    st.just("60.0"),  # MAX_PAUSE_S
    st.floats(0, 60).map(repr),  # the most a turn may wait
    st.just("300"),  # TTL
    st.one_of(st.just("0.0"), st.floats(0, 90).map(repr)),  # a 429's pause
    _dimension(),
    _dimension(),
).map(lambda a: (*a[:6], *a[6], *a[7]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_python_step_is_the_lua_script(
    server: fakeredis.FakeRedis, data: st.DataObject
) -> None:
    fields = data.draw(_stored(time.time()))
    args = data.draw(_ARGS)
    server.delete(KEY)
    if fields:
        server.hset(KEY, mapping=fields)
    lua_reply = server.eval(BUCKET_SCRIPT, 1, KEY, *args)
    lua_fields = server.hgetall(KEY)
    now = float(lua_reply[2])
    stored, reply = bucket_step(fields, args, now)
    assert list(reply) == [str(x) for x in lua_reply]
    assert stored == lua_fields
    parse_reply(list(reply))  # and it is a reply the store accepts


def test_a_first_limit_fills_the_bucket_and_a_turn_is_taken_ahead() -> None:
    # 600 tokens a minute (10 a second), learned now: the bucket starts full.
    args = ("500.0", "50.0", "60.0", "60.0", "300", "0.0", "600.0", "1", "", "0.0")
    args = (*args, "0.0", "0", "", "0.0")
    stored, reply = bucket_step({}, args, 100.0)
    assert reply[0] == "1" and float(reply[1]) == 0 and float(stored["tV"]) == 100
    # The next 500 waits its turn: 400 short at 10 a second.
    stored, reply = bucket_step(stored, args, 100.0)
    assert reply[0] == "1" and math.isclose(float(reply[1]), 40.0)
    assert float(stored["tV"]) == -400
    # One whose deadline comes first takes nothing.
    short = ("500.0", "5.0", *args[2:])
    after, reply = bucket_step(stored, short, 100.0)
    assert reply[0] == "0" and after["tV"] == stored["tV"]
