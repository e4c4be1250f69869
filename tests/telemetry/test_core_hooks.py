"""Telemetry and the core: what the core counted before telemetry loaded is kept."""

from __future__ import annotations

import subprocess
import sys


def test_threads_abandoned_before_telemetry_loads_are_counted() -> None:
    """`import timebound` leaves telemetry unloaded; its counter still starts from the core's."""
    code = (
        "import sys, threading\n"
        "import timebound as tb\n"
        "blocker = threading.Event()\n"
        "try:\n"
        "    tb.run_in_thread(blocker.wait, timeout=0.01)\n"
        "except tb.DeadlineExceeded:\n"
        "    pass\n"
        "loaded = 'timebound.telemetry' in sys.modules\n"
        "from timebound.telemetry import counters\n"
        "print(loaded, counters.get('abandoned-threads'))\n"
        "blocker.set()\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True
    )
    assert done.stdout == "False 1\n", done.stderr
