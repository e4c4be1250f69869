"""Building blocks for engines and adapters built on timebound (as ``trio.lowlevel`` is trio's).

Application code needs ``timebound`` and ``timebound.policies``; the names here are for code that
implements a layer of its own — a client adapter, a server, an engine — and must decide what a
``DeadlineExceeded`` means to it or drive retries itself:

- :func:`classify`, :func:`bound_origin`, :func:`mark_enclosing`, :data:`Origin`: whose deadline
  an error is (docs/policies.md, "Whose deadline is it?");
- :func:`load_module`: the user's module named on a command line or in a configuration file (a
  dotted name or a ``.py`` file), imported the way every ``timebound`` command imports it;
- :class:`RetryPlan` and its decisions (:class:`AttemptNow`, :class:`RetryAt`, :class:`FallBack`,
  :class:`Stop`, :data:`Decision`) with :class:`RetryState`: the pure retry decision core that
  every driver (sync, asyncio, trio, the Constellation runtime) consults after a failed attempt.
"""

from .._core._classify import Origin, bound_origin, classify, mark_enclosing
from .._core._modules import load_module
from ..policies._retry import AttemptNow, Decision, FallBack, RetryAt, RetryPlan, RetryState, Stop

__all__ = [
    "AttemptNow",
    "Decision",
    "FallBack",
    "Origin",
    "RetryAt",
    "RetryPlan",
    "RetryState",
    "Stop",
    "bound_origin",
    "classify",
    "load_module",
    "mark_enclosing",
]
