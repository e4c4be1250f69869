"""The public surface: the contract the engines code against, and nothing leaking."""

from __future__ import annotations

import sys

import timebound
import timebound.policies as policies


def test_contract_names_are_exported() -> None:
    """Every name of the engines' contract is importable from timebound.policies."""
    for name in [
        "Policy",
        "Ok",
        "Err",
        "CacheBackend",
        "InMemoryCache",
        "Slots",
        "TokenBucket",
        "zero_value_for",
        "resilient",
        "MISSING",
    ]:
        assert name in policies.__all__, name
        assert hasattr(policies, name), name
    assert timebound.resilient is policies.resilient
    assert "resilient" in timebound.__all__


def test_engine_building_names_live_in_lowlevel() -> None:
    """The retry decision core and the classification are timebound.lowlevel's."""
    import timebound.lowlevel as lowlevel

    for name in ["RetryPlan", "RetryState", "AttemptNow", "RetryAt", "FallBack", "Stop"]:
        assert name in lowlevel.__all__ and name not in policies.__all__, name
    for name in ["Decision", "classify", "bound_origin", "mark_enclosing", "Origin"]:
        assert name in lowlevel.__all__ and name not in policies.__all__, name


def test_the_old_spelling_warns_and_names_the_new_one() -> None:
    """timebound.policies.RetryPlan still works for one release, with a DeprecationWarning."""
    import pytest

    import timebound.lowlevel as lowlevel

    with pytest.warns(DeprecationWarning, match=r"timebound\.lowlevel\.RetryPlan"):
        assert policies.RetryPlan is lowlevel.RetryPlan  # type: ignore[attr-defined]
    with pytest.warns(DeprecationWarning, match=r"timebound\.lowlevel\.classify"):
        assert policies.classify is lowlevel.classify  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        policies.no_such_name  # type: ignore[attr-defined]  # noqa: B018


def test_nothing_leaks() -> None:
    """Every public attribute of timebound.policies is listed in __all__."""
    public = {
        attr
        for attr, value in vars(policies).items()
        if not attr.startswith("_") and not isinstance(value, type(sys)) and attr != "annotations"
    }
    assert public <= set(policies.__all__)


def test_policy_signature_matches_the_contract() -> None:
    """Policy takes the contract's keywords with the contract's defaults."""
    import inspect

    params = inspect.signature(policies.Policy).parameters
    defaults = {n: p.default for n, p in params.items() if n != "name"}
    assert defaults == {
        "timeout": None,
        "retry": 0,
        "retry_on": None,
        "delay": None,
        "backoff": "fixed",
        "max_delay": 30.0,
        "jitter": False,
        "fallback": policies.MISSING,
        "fallback_on": None,
        "cache": None,
        "cache_backend": None,
        "cache_key": None,
        "on_error": "propagate",
        "zero": None,
        "throttle": None,
        "concurrency": None,
        "total_timeout": None,
        "retry_budget": None,
        "breaker": None,
        "hedge": None,
        "timeout_floor": None,
        "reserve": None,
    }
    execute = inspect.signature(policies.Policy.execute).parameters
    assert list(execute) == ["self", "fn", "args", "kwargs", "observer"]
    assert execute["observer"].kind is inspect.Parameter.KEYWORD_ONLY


def test_removed_register_cache_backend_says_where_it_went() -> None:
    """The old import fails with an ImportError naming ModuleRegistry.register_cache_backend (the
    process-wide registry it fed is gone, so nothing can be forwarded to)."""
    import pytest

    with pytest.raises(ImportError, match=r"ModuleRegistry\.register_cache_backend\(name, backend"):
        from timebound.policies import register_cache_backend  # noqa: F401
    with pytest.raises(ImportError, match=r"ModuleRegistry\.register_cache_backend"):
        from timebound.policies import get_cache_backend  # noqa: F401
    assert not hasattr(policies, "no_such_name")
