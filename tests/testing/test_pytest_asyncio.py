"""The virtual_clock fixture in tests that pytest-asyncio runs (real pytest-asyncio, pytester)."""

from __future__ import annotations

import asyncio
import selectors
import textwrap

import pytest

from timebound.testing import VirtualClock

pytest_plugins = ["pytester"]

FIRES_AT_30 = """
    import asyncio
    import pytest
    import timebound as tb

    {mark}
    async def test_fires(virtual_clock):
        with pytest.raises(tb.DeadlineExceeded):
            async with tb.fail_after(30):
                await asyncio.sleep(3600)
        assert virtual_clock.now() == 30.0
        assert asyncio.get_running_loop().time() == 30.0
"""


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytester whose runs load only the two plugins under test (the others installed here
    only slow the inner runs down)."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    return pytester


def _run(pytester: pytest.Pytester, test: str, ini: str = "") -> pytest.RunResult:
    pytester.makeini(f"[pytest]\nasyncio_default_fixture_loop_scope = function\n{ini}\n")
    pytester.makepyfile(textwrap.dedent(test))
    plugins = ["-p", "pytest_asyncio.plugin", "-p", "timebound.testing._pytest_plugin"]
    return pytester.runpytest(*plugins, "-p", "no:cacheprovider")


def test_marked_asyncio_test_runs_on_virtual_time(inner: pytest.Pytester) -> None:
    """With @pytest.mark.asyncio, fail_after(30) fires at exactly virtual 30 s."""
    result = _run(inner, FIRES_AT_30.format(mark="@pytest.mark.asyncio"))
    result.assert_outcomes(passed=1)


def test_auto_mode_test_runs_on_virtual_time(inner: pytest.Pytester) -> None:
    """With asyncio_mode = auto, an unmarked async test runs on virtual time too."""
    result = _run(inner, FIRES_AT_30.format(mark=""), ini="asyncio_mode = auto")
    result.assert_outcomes(passed=1)


def test_shared_loop_returns_to_real_time_after_the_test(inner: pytest.Pytester) -> None:
    """A module-scoped loop driven by one test runs on real time again in the next."""
    first = FIRES_AT_30.format(mark='@pytest.mark.asyncio(loop_scope="module")')
    test = textwrap.dedent(first) + textwrap.dedent("""
        @pytest.mark.asyncio(loop_scope="module")
        async def test_real_time_again():
            loop = asyncio.get_running_loop()
            assert "time" not in vars(loop)
            assert type(loop._selector).__name__ != "_VirtualSelector"
        """)
    result = _run(inner, test)
    result.assert_outcomes(passed=2)


def test_async_fixture_and_virtual_time_share_the_loop(inner: pytest.Pytester) -> None:
    """An async fixture of pytest-asyncio and the test body share one loop on virtual time."""
    test = """
        import asyncio
        import pytest
        import pytest_asyncio
        import timebound as tb

        @pytest_asyncio.fixture
        async def queue():
            return asyncio.Queue()

        @pytest.mark.asyncio
        async def test_wait(virtual_clock, queue):
            async with tb.move_on_after(5) as scope:
                await queue.get()
            assert scope.expired and virtual_clock.now() == 5.0
    """
    result = _run(inner, test)
    result.assert_outcomes(passed=1)


def test_sync_test_with_the_mark_is_left_alone(inner: pytest.Pytester) -> None:
    """A sync test that carries the asyncio mark keeps plain virtual time, and no loop is made."""
    test = """
        import asyncio
        import pytest

        @pytest.mark.asyncio
        def test_sync(virtual_clock):
            virtual_clock.advance(2)
            assert virtual_clock.now() == 2.0
            # no event loop was created for the thread on the test's behalf
            assert getattr(asyncio.get_event_loop_policy()._local, "_loop", None) is None
    """
    result = _run(inner, test)
    result.assert_outcomes(passed=1, warnings=1)  # pytest-asyncio's "not an async function"


def test_drive_restores_the_loop() -> None:
    """VirtualClock.drive() hands the loop back with its own time() and selector."""
    loop = asyncio.new_event_loop()
    try:
        selector = loop._selector  # type: ignore[attr-defined]
        clock = VirtualClock(100.0)
        with clock.drive(loop):
            assert loop.time() == 100.0
            assert loop.run_until_complete(asyncio.sleep(7, result="slept")) == "slept"
            assert clock.now() == 107.0
        assert loop._selector is selector  # type: ignore[attr-defined]
        assert "time" not in vars(loop)
    finally:
        loop.close()


def test_drive_refuses_a_loop_that_is_not_a_selector_loop() -> None:
    """A loop without a selector is refused with a message saying what to do instead."""

    class NotSelectorLoop(asyncio.AbstractEventLoop):
        pass

    with pytest.raises(RuntimeError, match=r"selector event loop, not NotSelectorLoop.*run\(\)"):
        with VirtualClock().drive(NotSelectorLoop()):
            pass  # pragma: no cover


def test_drive_refuses_a_running_loop() -> None:
    """Taking over a loop that is already running is refused."""

    async def main() -> None:
        with VirtualClock().drive(asyncio.get_running_loop()):
            pass  # pragma: no cover

    with pytest.raises(RuntimeError, match="is running"):
        asyncio.run(main())


def test_selector_is_the_default_kind() -> None:
    """The default asyncio loop on this platform is a selector loop (what drive() needs)."""
    loop = asyncio.new_event_loop()
    try:
        assert isinstance(loop._selector, selectors.BaseSelector)  # type: ignore[attr-defined]
    finally:
        loop.close()
