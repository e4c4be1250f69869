"""The process-wide kill switch for deadline propagation (userver's
``USERVER_DEADLINE_PROPAGATION_ENABLED`` dynamic config).

Each adapter also has a static switch (``enabled=False`` on a server middleware,
``propagate_header=False`` on a client). The runtime switch is read on every request, so flipping
it takes effect at once without a restart. Its initial value comes from the environment variable
``TIMEBOUND_DEADLINE_PROPAGATION_ENABLED`` (``0``/``false``/``no``/``off`` disable it).

What "disabled" means, per side:

* servers ignore incoming deadline headers: no deadline is set, nothing is answered 498;
* clients stop sending ``X-YaTaxi-Client-TimeoutMs`` and stop interpreting the remote
  ``X-YaTaxi-Deadline-Expired`` marker. Their timeouts are still clamped by the effective
  deadline, because local scopes (``fail_after`` …) are timebound's core model, not propagation
  (userver likewise keeps updating timeouts when the header is switched off).
"""

from __future__ import annotations

import os

__all__ = ["is_enabled", "set_enabled"]

ENV_VAR = "TIMEBOUND_DEADLINE_PROPAGATION_ENABLED"


def _from_env() -> bool:
    return os.environ.get(ENV_VAR, "1").strip().lower() not in {"0", "false", "no", "off"}


# A plain module global: reading it is one dict lookup, and a bool assignment is atomic.
_enabled: bool = _from_env()


def set_enabled(enabled: bool) -> None:
    """Turn deadline propagation on or off for the whole process, effective immediately."""
    global _enabled
    _enabled = bool(enabled)


def is_enabled() -> bool:
    """Whether deadline propagation is on for the process (see :func:`set_enabled`)."""
    return _enabled
