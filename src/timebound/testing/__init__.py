"""Testing helpers shipped with timebound: virtual time and a pytest plugin.

``VirtualClock`` drives sync code, asyncio (autojump) and trio on virtual time, so timeout logic is
tested with exact instants and no real sleeps. The pytest plugin (registered automatically) gives
the ``virtual_clock`` fixture; ``async def`` tests that request it run on its event loop.
"""

from ._virtual import VirtualClock, VirtualEventLoop, virtual_time

__all__ = ["VirtualClock", "VirtualEventLoop", "virtual_time"]
