"""The share of upstream Constellation programs timebound accepts, and
upstream's example programs run with the results their comments describe.

The programs are read from a local copy of the upstream repository (github.com/VledicFranco/
constellation-engine), never from this repository: bring one as a bare git directory (for
example with ``git clone --bare``) and run::

    python bench/dsl_corpus.py --mirror PATH/TO/constellation-engine.git [--commit SHA] \
        [--out bench/results/dsl_corpus.json]

The commit defaults to the one recorded in ``bench/results/dsl_corpus.json``, so a re-run measures
the same programs. The corpus is every ``.cst`` file and every ``constellation`` code block of the
Markdown files at that commit. A program is *accepted* when it compiles against the standard
library and the application modules of ``tests/dsl/app_modules.py`` (a call of any other module is
left unchecked, as ``timebound check`` does without ``--modules``: documentation snippets call
modules nobody wrote).

Left out of the share: fragments without an ``out`` (upstream's parser requires
one) or with an ``out`` of an expression (upstream's ``out`` takes a name); the streaming RFC's
snippets (RFC-025), whose options timebound does not implement; and the programs reviewed as
rejected by upstream too (``dsl_corpus_rejects.py``), every one of which must still be rejected
here. The results file holds counts, paths and timebound's diagnostics, never upstream's text.

The example programs of ``modules/example-app/examples/`` then run on virtual time (two of them
against the Redis server at ``--redis``, default ``redis://127.0.0.1:6379/0``, under a fresh key
prefix removed afterwards) and their results are checked. The script exits non-zero when the share
misses the target, a reviewed program is accepted or an example's check fails. ``--quick`` measures
the share only (no examples). The results are written only with ``--out``; this is a count, not a
timing, so it has no repeats.
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import re
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # the application modules live with the tests

from dsl_corpus_rejects import REVIEWED  # noqa: E402
from tests.dsl.app_modules import RedisCache, make_registry  # noqa: E402

from timebound.dsl import CompileError, compile  # noqa: E402
from timebound.testing import VirtualClock  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "dsl_corpus.json"
REPOSITORY = "github.com/VledicFranco/constellation-engine"
TARGET = 0.95
EXAMPLES = "modules/example-app/examples/"

_FENCE = re.compile(r"^```constellation[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
_OUT_LINE = re.compile(r"(?m)^[ \t]*out[ \t]+(\S+)")
_NAME = re.compile(r"[^\W\d]\w*(?:-\w+)*")


@dataclass(frozen=True)
class Program:
    path: str
    block: int | None  # index of the constellation block in a Markdown file; None for .cst
    text: str


class Mirror:
    """Files of one commit of a bare git directory."""

    def __init__(self, path: pathlib.Path, commit: str) -> None:
        self.path = path
        self.commit = commit

    def _git(self, *args: str) -> bytes:
        done = subprocess.run(["git", "-C", str(self.path), *args], capture_output=True)
        if done.returncode != 0:
            error = done.stderr.decode(errors="replace").strip()
            raise SystemExit(f"--mirror {self.path}: git {args[0]} failed: {error}")
        return done.stdout

    def names(self) -> list[str]:
        out = self._git("ls-tree", "-r", "-z", "--name-only", self.commit).decode()
        return sorted(n for n in out.split("\0") if n)

    def read(self, name: str) -> str:
        return self._git("show", f"{self.commit}:{name}").decode("utf-8")


def programs(mirror: Mirror) -> list[Program]:
    result: list[Program] = []
    for name in mirror.names():
        if name.endswith(".cst"):
            result.append(Program(name, None, mirror.read(name)))
        elif name.endswith(".md"):
            text = mirror.read(name)
            result += [Program(name, i, m.group(1)) for i, m in enumerate(_FENCE.finditer(text))]
    return result


def left_out_because(p: Program) -> str | None:
    """Why a program is not counted (None: it counts)."""
    reviewed = REVIEWED.get((p.path, p.block))
    if reviewed is not None:
        return f"upstream rejects it too: {reviewed}"
    if "rfc-025" in p.path:
        return "streaming RFC-025"
    outs = _OUT_LINE.findall(p.text)
    if not outs:
        return "no 'out' (upstream's parser requires one)"
    if any(not _NAME.fullmatch(o) for o in outs):
        return "'out' of an expression (upstream's 'out' takes a name)"
    return None


# Registered so that `cache_backend: "redis"` resolves; compiling never connects to it.
_UNUSED_REDIS = RedisCache("redis://127.0.0.1:6379/0", "timebound-corpus-unused:")


def first_error(text: str) -> dict[str, Any] | None:
    """None when timebound accepts ``text``, else its first error (E009 ignored)."""
    try:
        compile(text, modules=make_registry(_UNUSED_REDIS))
    except CompileError as exc:
        for d in exc.diagnostics:
            if d.severity == "error" and d.code != "E009":
                return {"line": d.line, "column": d.column, "code": d.code, "message": d.message}
    return None


def measure(all_programs: list[Program]) -> dict[str, Any]:
    left_out: Counter[str] = Counter()
    rejected: list[dict[str, Any]] = []
    accepted = 0
    for p in all_programs:
        reason = left_out_because(p)
        if reason is not None:
            left_out[reason] += 1
            continue
        error = first_error(p.text)
        if error is None:
            accepted += 1
        else:
            rejected.append({"path": p.path, "block": p.block, **error})
    counted = len(all_programs) - sum(left_out.values())
    found = {(p.path, p.block): p for p in all_programs}
    return {
        "programs": len(all_programs),
        "left_out": dict(left_out.most_common()),
        "counted": counted,
        "accepted": accepted,
        "share": round(accepted / counted, 4) if counted else 0.0,
        "target": TARGET,
        "rejected": rejected,
        # The reviewed list must name programs that exist and that timebound rejects too.
        "reviewed_missing": [list(k) for k in REVIEWED if k not in found],
        "reviewed_accepted": [
            list(k) for k in REVIEWED if k in found and first_error(found[k].text) is None
        ],
    }


# The example programs ------------------------------------------------------------------------

Outputs = dict[str, Any]


def run_example(
    text: str, inputs: dict[str, Any] | None = None, cache: RedisCache | None = None
) -> tuple[Outputs, float]:
    """Run a program on virtual time with its @example inputs (and ``inputs``)."""
    program = compile(text, modules=make_registry(cache))
    clock = VirtualClock()
    with clock:
        outputs = clock.run(program.run({**program.examples, **(inputs or {})}))
        return outputs, clock.now()


def _cache_demo(text: str, cache: RedisCache) -> list[str]:
    out, elapsed = run_example(text, cache=cache)
    (key,) = cache.client.scan_iter(match=cache.prefix + "*")
    ttl = cache.client.pttl(key)
    return _failures(
        ("the repeated query is the cached result", out["result1"] == out["result2"]),
        ("the query result", out["result1"] == "Result for: SELECT * FROM users"),
        ("the API result", out["apiResult"] == "API response from: https://api.example.com/slow"),
        ("calls run concurrently; ExpensiveCompute takes 2s", elapsed == 2.0),
        ("one key in Redis expiring within the hour", 0 < ttl <= 3_600_000),
    )


def _caching_strategies(text: str, cache: RedisCache) -> list[str]:
    out, _ = run_example(text, cache=cache)
    return _failures(
        (
            "the cached exchange rates",
            out["exchangeRates"] == "API response from: https://exchange-rates.example.com/latest",
        ),
        (
            "the flaky call succeeds on its third try",
            out["resilientCached"] == "Success for: user-42",
        ),
    )


def _branch(text: str) -> list[str]:
    out, _ = run_example(text)
    return _failures(
        ("an 85 is a B", out["grade"] == "B" and out["gradeIfElse"] == "B"),
        ("the fast path", out["processingTier"] == "fast-path"),
    )


def _match(text: str) -> list[str]:
    out, _ = run_example(text)
    expected = {
        "responseMessage": "Success: ok with value 42",
        "userMessage": "User Alice is active: true",
        "isSuccess": True,
        "statusCode": 200,
        "summary": "User: Alice",
    }
    return _failures(("record patterns pick the member and bind its fields", out == expected))


def _guard(text: str) -> list[str]:
    out, _ = run_example(text)
    return _failures(
        ("the guard holds", out["highScoreMessage"] == "Excellent!"),
        ("?? supplies the defaults", out["actualHighBonus"] == 0 and out["totalBonus"] == 25),
    )


def _lambdas(text: str) -> list[str]:
    out, _ = run_example(text, {"numbers": [-3, 0, 5, 12]})
    return _failures(
        ("filter keeps the positives", out["positives"] == [5, 12]),
        ("filter keeps those above 10", out["above10"] == [12]),
    )


def _namespaces(text: str) -> list[str]:
    out, _ = run_example(text)
    expected = {"result1": 15, "result2": 50, "trimmed_greeting": "Hello from namespace!"}
    return _failures(("use and aliases resolve the standard functions", out == expected))


def _retry(text: str) -> list[str]:
    out, elapsed = run_example(text)
    return _failures(
        ("FlakyService succeeds on its third attempt", out["reliableResult"].startswith("Success")),
        ("the timed-out call is retried", out["timeoutResult"].startswith("Response for")),
        ("the failing call falls back", out["safeResult"] == "default fallback response"),
        ("the slow API answers in time", out["apiResult"].startswith("API response")),
        # flaky: attempts at 0, 0.1, 0.3; timed out: 0.5 + 0.05 + 0.1; the API call: 1s.
        ("all run concurrently, the API call bounds the run", elapsed == 1.0),
    )


def _lazy(text: str) -> list[str]:
    out, elapsed = run_example(text)
    return _failures(
        ("the quick check", out["quickResult"] == "valid"),
        ("the lazy value is computed", out["lazyComputed"].startswith("Computed: COMPLEX")),
        ("ExpensiveCompute (2s) bounds the run", elapsed == 2.0),
    )


def _data_pipeline(text: str) -> list[str]:
    out, _ = run_example(text)
    return _failures(
        ("filter, scale and sum", out["filtered"] == [6] and out["total"] == 12),
        ("format", out["formattedTotal"] == "12"),
    )


def _text_analysis(text: str) -> list[str]:
    out, _ = run_example(text)
    return _failures(("words and characters", out["words"] == 16 and out["chars"] == 84))


def _fan_out(text: str) -> list[str]:
    # A fresh FlakyService fails its first call (as upstream's does), which fails the run.
    try:
        run_example(text)
    except ConnectionError as exc:
        return _failures(("the flaky call fails the run", "attempt 1)" in str(exc)))
    return ["the flaky call fails the run"]


def _conditional_branching(text: str) -> list[str]:
    out, _ = run_example(text)  # score 85, premium tier
    low, _ = run_example(text, {"score": 40, "tier": "basic", "defaultMessage": "hi"})
    return _failures(
        (
            "85 is gold; premium with 80+ is fast-tracked",
            (out["category"], out["route"]) == ("gold", "fast-track"),
        ),
        (
            "the guards hold, so ?? keeps their values",
            out["offerMessage"].startswith("Free") and out["bonusMessage"].startswith("Bonus"),
        ),
        ("the chain stops at the second guard", out["finalMessage"].startswith("Gold")),
        (
            "40 is bronze, routed as standard",
            (low["category"], low["route"]) == ("bronze", "standard"),
        ),
        (
            "failed guards give the defaults",
            low["offerMessage"].startswith("Standard") and low["bonusMessage"].startswith("No"),
        ),
        ("the chain ends at the input", low["finalMessage"] == "hi"),
    )


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _error_handling(text: str) -> list[str]:
    program = compile(text, modules=make_registry())
    logged = _Records()
    logging.getLogger().addHandler(logged)
    try:
        out, _ = run_example(text)
    finally:
        logging.getLogger().removeHandler(logged)
    messages = [r.getMessage() for r in logged.records]
    return _failures(
        ("on_error: log logs the one failure it absorbs", len(messages) == 1),
        ("naming the module", bool(messages) and "AlwaysFailsService" in messages[0]),
        ("skip and log give the zero value", (out["skipped"], out["logged"]) == ("", "")),
        ("retry gets FlakyService through", out["robustResult"] == "Success for: flaky-request"),
        ("the fallback wins over on_error", out["safeCritical"] == program.examples["safeDefault"]),
    )


def _resilient_pipeline(text: str) -> list[str]:
    out, elapsed = run_example(text)
    user, product = out["userData"], out["productData"]
    return _failures(
        ("FlakyService succeeds on its third attempt", user == "Success for: user-123"),
        ("the product call answers", product == "API response from: product-456"),
        ("the lazy outputs are computed", out["recommendation"] == f"Computed: {user.upper()}"),
        ("from the values they read", out["deepInsights"] == f"Deep analysis of: {product}"),
        ("the rate-limited call answers", out["enrichedData"].startswith("Rate-limited")),
        # user data at 0.3 (delays 100ms, 200ms) + 2s compute; product at 1.0 + 1.5s analysis.
        ("the deep analysis ends the run", elapsed == 2.5),
    )


def _string_interpolation(text: str) -> list[str]:
    out, _ = run_example(text)  # Alice, 28, balance 1500
    return _failures(
        ("names interpolate", "Alice" in out["greeting"] and "ALICE" in out["formalGreeting"]),
        ("arithmetic interpolates", "29" in out["ageNextYear"]),
        (
            "escapes: newline, tab, dollar",
            "\n\t" in out["formatted"] and "$1500" in out["formatted"],
        ),
        ("a branch value interpolates", out["statusMessage"].endswith("healthy")),
    )


def _simple(text: str) -> list[str]:
    program = compile(text, modules=make_registry())
    out, _ = run_example(text)
    return _failures(("uppercase", out["result"] == program.examples["message"].upper()))


def _optional_types(text: str) -> list[str]:
    given = {"maybeValue": None, "maybeName": "Bo", "maybeMultiplier": 3}
    out, _ = run_example(text, {**given, "maybeTimeout": None, "maybeRetries": 2})
    expected = {
        "value": 100,  # the default: maybeValue is none
        "name": "Bo",
        "multiplier": 3,
        "safeScore": 85,
        "finalValue": 10,  # 85: not above 90, above 50
        "scaledValue": 300,
        "finalScaledBonus": 300,
        "timeout": 30,
        "retries": 2,
        "totalWaitTime": 60,
    }
    return _failures(("optionals unwrap with their defaults", out == expected))


def _union_types(text: str) -> list[str]:
    given = {
        "result": {"error": "e", "code": 7},
        "userId": 12,
        "response": {"data": "d", "count": 1},
        "state": {"failed": "f"},
        "scoringInput": {"reason": "r"},
    }
    out, _ = run_example(text, given)
    passed = {k: out[f"output{k[0].upper()}{k[1:]}"] for k in ("result", "userId", "response")}
    return _failures(
        ("union values pass through", passed == {k: given[k] for k in passed}),
        ("records of the last member too", out["outputState"] == given["state"]),
        ("and inputs straight to outputs", out["scoringInput"] == given["scoringInput"]),
        ("42 is not above 50", out["statusMessage"].startswith("Standard")),
    )


def _lead_scoring(text: str) -> list[str]:
    company = {"name": "Acme", "industry": " software ", "employeeCount": 800}
    engagement = {"websiteVisits": 6, "emailOpens": 3, "contentDownloads": 2}
    out, _ = run_example(
        text,
        {
            "company": {**company, "annualRevenue": 2_000_000},
            "engagement": {**engagement, "description": "  We build tools "},
        },
    )
    # Large company 100, revenue 200 capped at 100, 11 engagements 100, 3 words 25:
    # 100/4 + 100*3/10 + 100/4 + 25/5 = 85, no keyword match, so no bonus.
    expected = {
        "displayName": "ACME",
        "normalizedIndustry": "software",
        "companySizeScore": 100,
        "revenueScore": 100,
        "engagementScore": 100,
        "textQualityScore": 25,
        "totalEngagement": 11,
        "scaledEngagement": 22,
        "descWordCount": 3,
        "hasIndustryMatch": False,
        "isQualified": True,
        "isHighPriority": True,
        "isDisqualified": False,
        "rawTotalScore": 85,
        "industryBonus": 0,
        "finalScore": 85,
        "formattedTotal": "85",
        "isHotLead": True,
        "isWarmLead": False,
        "isColdLead": False,
        "meetsMinimum": True,
        "scoreDifference": 25,
        "isAboveThreshold": True,
        "isBelowThreshold": False,
        "isAtThreshold": False,
        "doubleScore": 170,
        "halfScore": 42,
        "conditionalBonus": None,
        "adjustmentFactor": 0,
        "premiumLead": None,
        "leadCategory": 85,
        "tieredBonus": 30,
        "finalScoreWithTieredBonus": 115,
    }
    wrong = sorted(k for k in expected if out.get(k, "missing") != expected[k])
    return [f"lead scores ({', '.join(wrong)})"] if wrong else []


def _failures(*checks: tuple[str, bool]) -> list[str]:
    return [name for name, ok in checks if not ok]


CHECKS: dict[str, Callable[[str], list[str]]] = {
    "branch-expressions.cst": _branch,
    "match-expressions.cst": _match,
    "guard-and-coalesce.cst": _guard,
    "lambdas-and-hof.cst": _lambdas,
    "namespaces.cst": _namespaces,
    "retry-resilience-demo.cst": _retry,
    "priority-lazy-demo.cst": _lazy,
    "data-pipeline.cst": _data_pipeline,
    "text-analysis.cst": _text_analysis,
    "fan-out-fan-in.cst": _fan_out,
    "conditional-branching.cst": _conditional_branching,
    "error-handling-demo.cst": _error_handling,
    "resilient-pipeline-demo.cst": _resilient_pipeline,
    "string-interpolation.cst": _string_interpolation,
    "simple-test.cst": _simple,
    "optional-types.cst": _optional_types,
    "union-types.cst": _union_types,
    "lead-scoring-pipeline.cst": _lead_scoring,
}
REDIS_CHECKS: dict[str, Callable[[str, RedisCache], list[str]]] = {
    "cache-demo.cst": _cache_demo,
    "caching-strategies.cst": _caching_strategies,
}
# Refused here, accepted upstream: call sites of one module declaring different concurrency
# limits (D3.7).
NOT_COMPILED = {"rate-limiting-demo.cst"}


def check_examples(all_programs: list[Program], redis_url: str) -> dict[str, dict[str, Any]]:
    """Per example program: what was checked and which checks failed."""
    results: dict[str, dict[str, Any]] = {}
    for p in all_programs:
        name = p.path.removeprefix(EXAMPLES)
        if p.block is not None or "/" in name or not p.path.startswith(EXAMPLES):
            continue
        if name in NOT_COMPILED:
            results[name] = {"checked": "refused (D3.7)", "failed": _refused(p.text)}
        elif name in CHECKS:
            try:
                failed = CHECKS[name](p.text)
            except Exception as exc:  # reported as the example's failure, the others still run
                failed = [f"raised {type(exc).__name__}: {exc}"]
            results[name] = {"checked": "results", "failed": failed}
        elif name in REDIS_CHECKS:
            cache = RedisCache(redis_url, f"timebound-bench:{uuid.uuid4()}:")
            try:
                failed = REDIS_CHECKS[name](p.text, cache)
            finally:
                cache.clear()
            results[name] = {"checked": "results on Redis", "failed": failed}
        else:
            ok = bool(compile(p.text, modules=make_registry()).outputs)
            results[name] = {"checked": "compiles", "failed": [] if ok else ["compiles"]}
    return results


def _refused(text: str) -> list[str]:
    error = first_error(text)
    return [] if error is not None and error["code"] == "E013" else ["refused with E013"]


def main(argv: list[str] | None = None) -> int:
    recorded = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mirror", type=pathlib.Path, required=True, help="bare git directory")
    parser.add_argument("--commit", default=recorded.get("upstream_commit"), required=not recorded)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--quick", action="store_true", help="the share only, no examples")
    parser.add_argument("--out", type=pathlib.Path, default=None, help="write the results here")
    args = parser.parse_args(argv)

    corpus = programs(Mirror(args.mirror, args.commit))
    doc = {"upstream": REPOSITORY, "upstream_commit": args.commit, **measure(corpus)}
    doc["examples"] = {} if args.quick else check_examples(corpus, args.redis)
    if args.out is not None:
        args.out.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        print(f"wrote {args.out}")

    print(f"{doc['accepted']} of {doc['counted']} counted programs accepted: {doc['share']:.1%}")
    print(f"({doc['programs']} programs, {doc['programs'] - doc['counted']} left out)")
    for r in doc["rejected"]:
        print(f"  rejected {r['path']}#{r['block']}: {r['line']}:{r['column']} {r['code']}")
    failed = {n: r["failed"] for n, r in doc["examples"].items() if r["failed"]}
    print(f"{len(doc['examples']) - len(failed)} of {len(doc['examples'])} examples pass")
    problems = [
        *(["share below target"] if doc["share"] < TARGET else []),
        *(f"reviewed program not in the corpus: {k}" for k in doc["reviewed_missing"]),
        *(f"reviewed program accepted: {k}" for k in doc["reviewed_accepted"]),
        *(f"{name}: {', '.join(checks)}" for name, checks in failed.items()),
    ]
    for problem in problems:
        print("FAILED:", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
