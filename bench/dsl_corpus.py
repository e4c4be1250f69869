"""The share of upstream Constellation programs timebound accepts (issue 14's measurement).

Run: ``python bench/dsl_corpus.py`` (a few seconds). Prints the share and writes
``bench/results/dsl_corpus.json``: the counts, why programs were left out, and the first
diagnostic of every counted program timebound rejects. The corpus, the rules for what counts and
the reviewed list of programs upstream rejects too are in ``tests/dsl/upstream/`` (see
``corpus.py`` there); ``tests/dsl/test_upstream.py`` checks the share stays at or above the
target.
"""

from __future__ import annotations

import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the corpus and its modules live with the tests

from tests.dsl.upstream.corpus import measure  # noqa: E402

TARGET = 0.95


def main() -> None:
    m = measure()
    doc = {
        "programs": m.total,
        "left_out": dict(m.left_out.most_common()),
        "counted": m.counted,
        "accepted": m.accepted,
        "share": round(m.share, 4),
        "target": TARGET,
        "rejected": m.rejected,
    }
    path = ROOT / "bench" / "results" / "dsl_corpus.json"
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    print(f"{m.accepted} of {m.counted} counted programs accepted: {m.share:.1%} (target 95%)")
    print(f"({m.total} programs, {m.total - m.counted} left out; details in {path.name})")
    for r in m.rejected:
        print(f"  rejected {r['source']}#{r['block']}: {r['diagnostic']}")


if __name__ == "__main__":
    main()
