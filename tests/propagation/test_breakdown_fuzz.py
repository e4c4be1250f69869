"""Hostile breakdown headers (D13.5): parsing never raises and never grows memory."""

from __future__ import annotations

import gc
import json
import logging
import tracemalloc
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from timebound import Breakdown
from timebound.propagation import _breakdown_wire as wire

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=200),
)
_keys = st.sampled_from(["k", "ms", "n", "b", "o", "at", "p", "x", ""])
_kinds = st.sampled_from(["bound", "call", "remote", "self", "attempt", "nope", ""])
_json = st.recursive(
    _scalars | _kinds,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(_keys, inner, max_size=7),
    max_leaves=60,
)


def _check(value: Any) -> None:
    result = wire.parse(value)
    assert result is None or isinstance(result, Breakdown)
    if result is not None:
        assert len(result) <= 256
        # What parses, serialises back within the limit it was read under.
        assert Breakdown.from_json(result.to_json(), max_bytes=1 << 20) == result


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(_json)
def test_structured_garbage_never_raises(data: Any) -> None:
    logging.getLogger("timebound.propagation").disabled = True
    try:
        _check(json.dumps(data, allow_nan=True))
        _check(json.dumps(data, allow_nan=True).encode("utf-8"))
    finally:
        logging.getLogger("timebound.propagation").disabled = False


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=5000), st.text(max_size=5000)))
def test_bytes_and_text_never_raise(value: bytes | str) -> None:
    logging.getLogger("timebound.propagation").disabled = True
    try:
        _check(value)
    finally:
        logging.getLogger("timebound.propagation").disabled = False


def test_deep_nesting_and_huge_numbers_are_refused_quietly() -> None:
    logging.getLogger("timebound.propagation").disabled = True
    try:
        assert wire.parse("[" * 1500 + "]" * 1500) is None
        assert wire.parse('{"k":"call","ms":1' + ',"p":[{"k":"call","ms":1' * 300) is None
        assert wire.parse('{"k":"call","ms":1e999}') is None
        assert wire.parse('{"k":"call","ms":' + "9" * 1500 + "}") is None
    finally:
        logging.getLogger("timebound.propagation").disabled = False


def test_memory_stays_flat_under_a_stream_of_hostile_headers() -> None:
    logging.getLogger("timebound.propagation").disabled = True
    hostile = [
        b"{" * 2000,
        b'{"k":"bound","ms":1,"p":[' + b'{"k":"call","ms":1},' * 90 + b'{"k":"self","ms":0}]}',
        b"\xff\xfe" * 900,
        b'{"k":"bound","ms":1,"n":"' + b"a" * 1900 + b'"}',
    ]
    try:
        for v in hostile * 50:
            wire.parse(v)
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        for v in hostile * 500:
            wire.parse(v)
        gc.collect()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
        assert grown < 64 * 1024, grown
    finally:
        logging.getLogger("timebound.propagation").disabled = False


def test_malformed_is_warned_at_most_once_a_minute(caplog: Any, virtual_clock: Any) -> None:
    wire._warnings.next_at = float("-inf")
    wire._warnings.quiet = 0
    with caplog.at_level(logging.WARNING, logger="timebound.propagation"):
        for _ in range(10):
            assert wire.parse("{") is None
        virtual_clock.advance(61)
        assert wire.parse("{") is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "9 more ignored" in lines[1]
