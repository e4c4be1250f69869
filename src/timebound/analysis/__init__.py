"""The worst-case time check: contradictions between time bounds, found before anything runs
(D14).

``check_time(target, budget=...)`` reads a Constellation program, a module of ``resilient``
policies, a pipeline plan or a workflow definition, computes the worst-case time of each
composition (a retry loop, a call chain, a region, a node, a join) with the engines' own
functions, and returns a :class:`Report` of :class:`Finding`\\ s, each with a stable code
(:data:`CODES`), a severity, where it is written, the numbers and a fix. ``timebound check``
prints the same report.

>>> import timebound as tb
>>> from timebound.analysis import check_policy
>>> policy = tb.resilient(timeout="5s", retry=3, total_timeout="4s")(lambda: None)
>>> [f.code for f in check_policy(policy).findings]
['TB-T004', 'TB-T002', 'TB-T030']
"""

from __future__ import annotations

from ._api import check_constellation, check_pipeline, check_time, check_workflow
from ._findings import CODES, Code, Finding, Location, Report, Severity, report_schema
from ._input import KINDS, CheckInputError, Kind
from ._policies import check_module, check_policy, policies_of

__all__ = [
    "CODES",
    "KINDS",
    "CheckInputError",
    "Code",
    "Finding",
    "Kind",
    "Location",
    "Report",
    "Severity",
    "check_constellation",
    "check_module",
    "check_pipeline",
    "check_policy",
    "check_time",
    "check_workflow",
    "policies_of",
    "report_schema",
]
