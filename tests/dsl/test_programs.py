"""Whole programs of our own, written the way Constellation users write theirs (the features
upstream's example programs use: annotations, branch, match, guards, lambdas, namespaces,
resilience options, caches on Redis), run on virtual time with the application modules of
``app_modules.py`` and asserted results. ``bench/dsl_corpus.py`` runs upstream's own examples."""

from __future__ import annotations

import pathlib
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from timebound.cli import main
from timebound.dsl import compile
from timebound.dsl._registry import ModuleRegistry
from timebound.testing import VirtualClock

from .app_modules import RedisCache, make_registry


def _run(
    source: str,
    inputs: dict[str, Any] | None = None,
    registry: ModuleRegistry | None = None,
) -> tuple[dict[str, Any], float]:
    """Run ``source`` on virtual time with its @example inputs (and ``inputs``)."""
    program = compile(source, modules=registry or make_registry())
    clock = VirtualClock()
    with clock:
        outputs = clock.run(program.run({**program.examples, **(inputs or {})}))
        return outputs, clock.now()


SHIPPING = """
# Parcels are priced by weight band; heavy ones to remote zones go by freight.
@example(7)
in kilos: Int
@example(true)
in remote: Boolean

band = branch {
  kilos < 2 -> "letter",
  kilos < 10 -> "parcel",
  otherwise -> "pallet"
}
carrier = if (remote and kilos >= 5) "freight" else "courier"
out band
out carrier
"""


def test_branch_takes_the_first_true_case() -> None:
    """A 7 kg parcel falls in the second band; remote and heavy picks freight."""
    assert _run(SHIPPING)[0] == {"band": "parcel", "carrier": "freight"}


def test_branch_falls_through_to_otherwise() -> None:
    """No case holds for 40 kg, so `otherwise` gives the value."""
    assert _run(SHIPPING, {"kilos": 40, "remote": False})[0] == {
        "band": "pallet",
        "carrier": "courier",
    }


PAYMENT = """
type Outcome = { amount: Int, currency: String } | { declined: String } | { retryAfter: Int }

@example({ declined: "insufficient funds" })
in outcome: Outcome

receipt = match outcome {
  { amount, currency } -> "charged ${amount} ${currency}",
  { declined } -> "refused: ${declined}",
  { retryAfter } -> "try again in ${retryAfter}s"
}
settled = match outcome {
  { amount, currency } -> true,
  _ -> false
}
out receipt
out settled
"""


def test_match_binds_the_fields_of_the_member_it_picks() -> None:
    """A declined payment matches the `declined` record and binds its reason."""
    assert _run(PAYMENT)[0] == {"receipt": "refused: insufficient funds", "settled": False}


def test_match_picks_the_first_member_with_its_fields() -> None:
    """A charge matches the amount/currency record; the wildcard is not reached."""
    outputs, _ = _run(PAYMENT, {"outcome": {"amount": 30, "currency": "EUR"}})
    assert outputs == {"receipt": "charged 30 EUR", "settled": True}


LOYALTY = """
@example(120)
in spent: Int

gold = "gold member" when spent >= 100
voucher = 15 when spent >= 500
label = gold ?? "regular"
credit = (voucher ?? 0) + 5
out label
out credit
"""


def test_guard_holds_and_coalesce_keeps_the_value() -> None:
    """A guard whose condition holds gives its value, which ?? keeps."""
    assert _run(LOYALTY)[0]["label"] == "gold member"


def test_guard_fails_and_coalesce_supplies_the_default() -> None:
    """A guard whose condition fails gives none, and ?? supplies the default."""
    assert _run(LOYALTY)[0]["credit"] == 5


LAMBDAS = """
use stdlib.collection
use stdlib.compare

in temperatures: List<Int>

frosty = filter(temperatures, (t) => lt(t, 0))
doubled = map(temperatures, (t) => t * 2)
allMild = all(temperatures, (t) => gt(t, -10))
anyHot = any(temperatures, (t) => gte(t, 30))
out frosty
out doubled
out allMild
out anyHot
"""


def test_lambdas_with_higher_order_functions() -> None:
    """filter, map, all and any apply their lambda to every element."""
    outputs, _ = _run(LAMBDAS, {"temperatures": [-4, 12, 31, 0]})
    assert outputs == {
        "frosty": [-4],
        "doubled": [-8, 24, 62, 0],
        "allMild": True,
        "anyHot": True,
    }


NAMESPACES = """
use stdlib.math
use stdlib.string as text

@example("  spaced out  ")
in phrase: String

total = add(multiply(6, 7), 8)
tidy = text.trim(phrase)
out total
out tidy
"""


def test_use_brings_names_into_scope_and_as_aliases_a_namespace() -> None:
    """`use stdlib.math` resolves add unqualified; `as text` qualifies trim."""
    assert _run(NAMESPACES)[0] == {"total": 50, "tidy": "spaced out"}


def test_retry_with_linear_backoff_reaches_the_third_attempt() -> None:
    """FlakyService fails twice; linear backoff waits 250 ms then 500 ms, so it answers at 0.75."""
    source = """
in order: String
confirmed = FlakyService(order) with retry: 2, delay: 250ms, backoff: linear
out confirmed
"""
    outputs, elapsed = _run(source, {"order": "A-17"})
    assert outputs == {"confirmed": "Success for: A-17"}
    assert elapsed == 0.75


def test_timed_out_attempt_is_retried() -> None:
    """The first, slow attempt times out at 0.4; after 100 ms the second answers in 0.1."""
    source = """
in ticket: String
reply = TimeoutProneService(ticket) with timeout: 400ms, retry: 1, delay: 100ms
out reply
"""
    outputs, elapsed = _run(source, {"ticket": "T-3"})
    assert outputs == {"reply": "Response for: T-3"}
    assert elapsed == 0.6


def test_fallback_after_every_attempt_failed() -> None:
    """A call that always fails gives its fallback once its two attempts are spent."""
    source = """
in note: String
in spare: String
saved = AlwaysFailsService(note) with retry: 1, fallback: spare
out saved
"""
    outputs, _ = _run(source, {"note": "n", "spare": "kept locally"})
    assert outputs == {"saved": "kept locally"}


def test_independent_calls_run_concurrently() -> None:
    """Two slow calls with no data between them take as long as the slower one."""
    source = """
in q: String
rows = SlowQuery(q)
page = SlowApiCall(q)
out rows
out page
"""
    outputs, elapsed = _run(source, {"q": "stock"})
    assert outputs == {"rows": "Result for: stock", "page": "API response from: stock"}
    assert elapsed == 1.0


def test_lazy_call_in_a_branch_not_taken_never_runs() -> None:
    """A lazy call only the untaken branch needs is never evaluated."""
    source = """
use stdlib.compare
in doc: String
verdict = QuickCheck(doc)
deep = DeepAnalysis(doc) with lazy
report = branch { eq-string(verdict, "valid") -> verdict, otherwise -> deep }
out report
"""
    outputs, elapsed = _run(source, {"doc": "plain memo"})
    assert outputs == {"report": "valid"}
    assert elapsed == 0.01


def test_failing_call_fails_the_run_with_its_position() -> None:
    """Without retry, the flaky call's first failure fails the run and names its call site."""
    source = "in id: String\nfirst = FlakyService(id)\nout first\n"
    with pytest.raises(ConnectionError, match=r"attempt 1\) \[at line 2, column 9"):
        _run(source, {"id": "x"})


@pytest.fixture
def redis_cache(redis_url: str) -> Iterator[RedisCache]:
    """A cache on the test Redis server under a fresh prefix, emptied afterwards."""
    cache = RedisCache(redis_url, f"timebound-test:{uuid.uuid4()}:")
    yield cache
    cache.clear()


def test_cache_on_redis_answers_the_second_run(redis_cache: RedisCache) -> None:
    """The second run of a program finds the result in Redis and takes no time."""
    source = """
in q: String
rows = SlowQuery(q) with cache: 5min, cache_backend: "redis"
out rows
"""
    program = compile(source, modules=make_registry(redis_cache))
    clock = VirtualClock()
    with clock:
        first = clock.run(program.run({"q": "open orders"}))
        halfway = clock.now()
        second = clock.run(program.run({"q": "open orders"}))
        assert (halfway, clock.now()) == (0.5, 0.5)
    assert first == second == {"rows": "Result for: open orders"}
    (key,) = redis_cache.client.scan_iter(match=redis_cache.prefix + "*")
    assert 0 < redis_cache.client.pttl(key) <= 300_000  # `cache: 5min`, on the server's clock


def test_run_without_modules_uses_examples(
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`timebound run` needs no --modules for a standard-library program and takes @example."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "greet.cst").write_text(
        'use stdlib.string\n@example("  Ada ")\nin who: String\n'
        'hello = concat("Hi, ", trim(who))\nout hello\n'
    )
    assert main(["run", "greet.cst"]) == 0
    assert capsys.readouterr().out == "hello = Hi, Ada\n"
