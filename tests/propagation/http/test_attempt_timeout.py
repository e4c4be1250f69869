"""Every client adapter's AttemptTimeout: retryable, the library's own timeout, picklable (D2.4)."""

from __future__ import annotations

import pickle

import aiohttp
import httpx
import pytest
import requests

import timebound as tb
from timebound.propagation import aiohttp as tb_aiohttp
from timebound.propagation import httpx as tb_httpx
from timebound.propagation import requests as tb_requests

CASES = [
    (tb_httpx.AttemptTimeout, httpx.TimeoutException),
    (tb_requests.AttemptTimeout, requests.exceptions.Timeout),
    (tb_aiohttp.AttemptTimeout, aiohttp.ServerTimeoutError),
]


@pytest.mark.parametrize(("cls", "library"), CASES)
def test_attempt_timeout_is_retryable_and_the_librarys_own(
    cls: type[tb.DeadlineExceeded], library: type[BaseException]
) -> None:
    """source="attempt", a TimeoutError and the client library's timeout exception."""
    err = cls("GET / timed out after 1.5s (attempt deadline)", remote=True, timeout=1.5)  # type: ignore[call-arg]
    assert err.source == "attempt"
    assert isinstance(err, library) and isinstance(err, TimeoutError)


@pytest.mark.parametrize(("cls", "library"), CASES)
def test_attempt_timeout_pickles_as_itself(
    cls: type[tb.DeadlineExceeded], library: type[BaseException]
) -> None:
    """A pickled AttemptTimeout comes back as the same class with its message and fields."""
    err = cls("GET / timed out after 1.5s (attempt deadline)", remote=True, timeout=1.5)  # type: ignore[call-arg]
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert str(back) == str(err)
    assert (back.source, back.remote, back.timeout) == ("attempt", True, 1.5)  # type: ignore[attr-defined]
