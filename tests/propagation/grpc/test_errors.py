"""The propagated gRPC error and the no-deadline rule, without a network."""

from __future__ import annotations

import pickle

import grpc
import grpc.aio
import pytest

import timebound as tb
from timebound.propagation.grpc import AioPropagatedDeadlineExceeded, PropagatedDeadlineExceeded

YEAR = 365 * 24 * 3600.0


def test_propagated_error_is_a_deadline_and_an_rpc_error() -> None:
    """The propagated error is caught by ``except TimeoutError`` and by ``except grpc.RpcError``."""
    err = PropagatedDeadlineExceeded("x", details="d")
    assert isinstance(err, tb.DeadlineExceeded) and isinstance(err, TimeoutError)
    assert isinstance(err, grpc.RpcError)
    assert err.source == "propagated"
    assert err.details() == "d"


def test_code_is_both_the_stable_string_and_the_grpc_status() -> None:
    """``err.code`` equals ``"deadline-exceeded"`` and ``err.code()`` is DEADLINE_EXCEEDED."""
    err = AioPropagatedDeadlineExceeded("x")
    assert err.code == "deadline-exceeded"
    assert err.code() is grpc.StatusCode.DEADLINE_EXCEEDED


def test_aio_error_is_an_aio_rpc_error() -> None:
    """The aio flavour is a ``grpc.aio.AioRpcError`` too."""
    assert isinstance(AioPropagatedDeadlineExceeded("x"), grpc.aio.AioRpcError)


@pytest.mark.parametrize("cls", [PropagatedDeadlineExceeded, AioPropagatedDeadlineExceeded])
def test_propagated_error_pickles(cls: type[PropagatedDeadlineExceeded]) -> None:
    """The error survives pickling with its class, message, source and details (D2.4)."""
    err = cls("gRPC x timed out", details="d", timeout=0.25)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert (str(back), back.source, back.details(), back.timeout) == (
        "gRPC x timed out",
        "propagated",
        "d",
        0.25,
    )
