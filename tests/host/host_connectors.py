"""The deferred connectors a served host takes with ``--connectors tests.host.host_connectors``."""

from __future__ import annotations

import os
from typing import Any

from timebound.deferred import HttpConnector


def connectors() -> dict[str, Any]:
    """Module ``render`` is polled and cancelled over HTTP at ``TB_TEST_RENDER_URL``."""
    return {"render": HttpConnector(os.environ["TB_TEST_RENDER_URL"])}
