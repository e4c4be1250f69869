"""The wire codecs: hostile header values never raise (D4.1), outgoing values round up (D4.3)."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from timebound.propagation import (
    HeaderNames,
    format_grpc_timeout,
    format_timeout_ms,
    parse_envoy_timeout,
    parse_grpc_timeout,
    parse_timeout_ms,
)
from timebound.propagation._codec import read_timeout
from timebound.testing import VirtualClock

# (header value, seconds or None). ``None`` = no deadline; 0.0 = already expired.
HOSTILE_TIMEOUT_MS = [
    ("300", 0.3),
    ("+300", 0.3),
    ("0", 0.0),
    ("-0", 0.0),
    ("+0", 0.0),
    ("-000", 0.0),
    ("000250", 0.25),
    (" 5", 0.005),  # RFC 9110 optional whitespace around a field value is not part of it
    ("5 ", 0.005),
    ("\t5\t", 0.005),
    ("", None),
    ("   ", None),
    ("+", None),
    ("-", None),
    ("--5", None),
    ("++5", None),
    ("-5", None),
    ("1 0", None),
    ("1e3", None),
    ("0x10", None),
    ("1.5", None),
    ("5ms", None),
    ("5s", None),
    ("inf", None),
    ("nan", None),
    ("٣٠٠", None),  # Arabic-Indic digits: int() would accept them, the wire must not
    ("\uff13\uff10\uff10", None),  # full-width digits
    ("²", None),
    ("5\n", None),
    ("5\x00", None),
    ("\x00", None),
    ("9" * 10_000, None),  # huge: rejected by length before any bignum conversion
    ("9223372036854775808", None),  # int64 overflow
    ("9223372036854775807", None),  # fits, but >= 10 years: ignored
    ("315360000000", None),  # exactly 10 years
    ("315359999999", 315359999.999),  # just under 10 years
]


@pytest.mark.parametrize(("value", "expected"), HOSTILE_TIMEOUT_MS)
def test_timeout_ms_header_parses_or_means_no_deadline(value: str, expected: float | None) -> None:
    """Every value either parses exactly or means no deadline; none raises."""
    assert parse_timeout_ms(value) == expected


@pytest.mark.parametrize(("value", "expected"), HOSTILE_TIMEOUT_MS)
def test_timeout_ms_header_as_latin1_bytes(value: str, expected: float | None) -> None:
    """Raw header bytes (as ASGI delivers them) give the same answer, non-ASCII bytes none."""
    raw = value.encode("utf-8")
    assert parse_timeout_ms(raw) == (expected if raw.isascii() else None)


def test_invalid_header_warns_at_most_once_a_minute(
    virtual_clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A flood of bad values logs one warning per header per 60 s, never an error."""
    with caplog.at_level(logging.WARNING, logger="timebound.propagation"):
        for _ in range(100):
            parse_timeout_ms("abc")
        virtual_clock.advance(59.999)
        parse_timeout_ms("abc")
        assert len(caplog.records) == 1
        virtual_clock.advance(0.001)
        parse_timeout_ms("abc")
    assert len(caplog.records) == 2
    assert "X-YaTaxi-Client-TimeoutMs" in caplog.records[0].getMessage()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("100m", 0.1),
        ("1S", 1.0),
        ("2M", 120.0),
        ("1H", 3600.0),
        ("250000u", 0.25),
        ("5000000n", 0.005),
        ("0m", 0.0),
        ("99999999m", 99999.999),
        ("123456789m", None),  # nine digits: over the limit
        ("99999999H", None),  # >= 10 years
        ("1", None),
        ("m", None),
        ("1.5S", None),
        ("-1S", None),
        ("1s", None),  # units are case-sensitive: "s" is not a unit
        ("1 S", None),
        ("", None),
    ],
)
def test_grpc_timeout_parses_or_means_no_deadline(value: str, expected: float | None) -> None:
    """grpc-timeout: at most 8 digits and a unit; anything else means no deadline."""
    result = parse_grpc_timeout(value)
    assert result == pytest.approx(expected) if expected is not None else result is None


def test_envoy_zero_means_infinite() -> None:
    """x-envoy-expected-rq-timeout-ms 0 is "infinite" in Envoy, so it is no deadline here."""
    assert parse_envoy_timeout("0") is None
    assert parse_envoy_timeout("1500") == 1.5
    assert parse_envoy_timeout("x") is None


def test_effective_timeout_is_the_minimum_of_all_headers() -> None:
    """With several deadline headers the smallest wins (D4.1)."""
    received = read_timeout(
        [
            ("x-yataxi-client-timeoutms", "500"),
            ("grpc-timeout", "200m"),
            ("x-envoy-expected-rq-timeout-ms", "300"),
        ]
    )
    assert received is not None and received.seconds == 0.2 and received.ms == 200


def test_invalid_header_does_not_hide_a_valid_one() -> None:
    """An unreadable header is skipped; the valid ones still set the deadline."""
    received = read_timeout([("x-yataxi-client-timeoutms", "junk"), ("grpc-timeout", "1S")])
    assert received is not None and received.seconds == 1.0


def test_configured_header_names_are_read() -> None:
    """Header names are configurable, and a disabled header is not read."""
    names = HeaderNames(timeout="X-Deadline-Ms", grpc_timeout=None, envoy_timeout=None)
    assert read_timeout([("x-deadline-ms", "40"), ("grpc-timeout", "1m")], names).seconds == 0.04  # type: ignore[union-attr]
    assert read_timeout([("x-yataxi-client-timeoutms", "40")], names) is None


@pytest.mark.parametrize(
    ("seconds", "wire"),
    [(0.3, "300"), (0.2999, "300"), (0.3001, "301"), (1e-7, "1"), (0.0, "1"), (5.0, "5000")],
)
def test_outgoing_timeout_is_whole_ms_rounded_up_never_zero(seconds: float, wire: str) -> None:
    """The outgoing header rounds up and never says 0 (D4.3)."""
    assert format_timeout_ms(seconds) == wire


@pytest.mark.parametrize(
    ("seconds", "wire"),
    [
        (0.3, "300000u"),
        (1e-9, "1n"),
        (5.0, "5000000u"),
        (3600.0, "3600000m"),
        (1e9, "16666667M"),
        (1e13, "99999999H"),
    ],
)
def test_outgoing_grpc_timeout_has_at_most_8_digits(seconds: float, wire: str) -> None:
    """grpc-timeout is encoded with at most 8 digits, rounded up."""
    assert format_grpc_timeout(seconds) == wire
    assert parse_grpc_timeout(wire) is None or parse_grpc_timeout(wire) >= seconds  # type: ignore[operator]


@given(st.one_of(st.text(max_size=64), st.binary(max_size=64)))
def test_parsers_never_raise(value: str | bytes) -> None:
    """Property: no header value makes any parser raise; results are None or >= 0."""
    for parse in (parse_timeout_ms, parse_grpc_timeout, parse_envoy_timeout):
        result = parse(value)
        assert result is None or result >= 0.0


@given(st.integers(min_value=0, max_value=315_359_999_999))
def test_every_decimal_below_ten_years_parses_exactly(ms: int) -> None:
    """Property: any decimal count of ms under 10 years reads back as that many ms."""
    assert parse_timeout_ms(str(ms)) == ms / 1000


@given(st.floats(min_value=0.0, max_value=3.0e8, allow_nan=False))
def test_outgoing_value_never_below_what_is_left(seconds: float) -> None:
    """Property: the wire value is >= 1 ms and never less than the time we have (rounded up)."""
    ms = int(format_timeout_ms(seconds))
    assert ms >= 1 and ms >= round(seconds * 1000, 6)
