"""Package contracts: public names, stdlib-only core, layering (docs/design/README.md)."""

from __future__ import annotations

import importlib
import pathlib
import subprocess
import sys

import pytest

SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "timebound"

# Public modules whose __all__ must be exactly their public surface.
PUBLIC_MODULES = [
    "timebound",
    "timebound.dsl",
    "timebound.testing",
    "timebound.telemetry",
    "timebound.propagation",
    "timebound.propagation.asgi",
    "timebound.propagation.wsgi",
    "timebound.propagation.httpx",
    "timebound.propagation.requests",
    "timebound.propagation.aiohttp",
    "timebound.admission",
]


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_all_is_complete_and_importable(name: str) -> None:
    """Every name in __all__ exists, and every public attribute is in __all__ (nothing leaks)."""
    module = importlib.import_module(name)
    exported = set(module.__all__)
    for attr in exported:
        assert hasattr(module, attr), f"{name}.__all__ lists missing {attr!r}"
    public = {
        attr
        for attr, value in vars(module).items()
        if not attr.startswith("_")
        and not isinstance(value, type(sys))  # submodules are fine
        and attr not in {"annotations"}
    }
    assert public <= exported, f"{name} leaks {sorted(public - exported)}"


def test_fixed_public_names() -> None:
    """The core names every user reaches for are importable from timebound."""
    import timebound

    for attr in [
        "Deadline",
        "current_deadline",
        "remaining",
        "fail_after",
        "fail_at",
        "move_on_after",
        "move_on_at",
        "no_deadline",
        "checkpoint",
        "acheckpoint",
        "spawn_background",
        "TimeboundError",
        "DeadlineExceeded",
        "RetryExhausted",
        "ConfigurationError",
    ]:
        assert hasattr(timebound, attr), attr
    assert issubclass(timebound.DeadlineExceeded, TimeoutError)
    assert issubclass(timebound.ConfigurationError, ValueError)


def test_core_imports_only_stdlib() -> None:
    """Every root name loads nothing outside the standard library (no trio, no httpx)."""
    code = (
        "import sys, timebound, timebound.testing._virtual;"
        "[getattr(timebound, name) for name in timebound.__all__];"
        "mods = {m.split('.')[0] for m in sys.modules};"
        "std = set(sys.stdlib_module_names) | {'timebound', '__main__', 'sitecustomize', "
        "'_distutils_hack', '__editable___timebound_0_1_0_finder'};"
        "print(sorted(m for m in mods if m not in std and not m.startswith('_')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "[]", f"non-stdlib modules imported by the core: {out}"


def test_root_package_loads_its_names_on_first_use() -> None:
    """`import timebound` loads no sub-package; the first use of a name loads its module."""
    code = (
        "import sys, timebound;"
        "before = sorted(m for m in sys.modules if m.startswith('timebound.'));"
        "timebound.fail_after;"
        "print(before, 'timebound._core._scopes' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "['timebound._version'] True"


#: Standard-library modules that a first deadline or a first policy call has no use for; each
#: is imported by the code path that needs it (run_in_process, an HTTP-date Retry-After, a cache
#: key of such a value; asyncio by whoever runs its loop). The first use costs a new process that
#: much less (bench/startup.py).
_NOT_ON_FIRST_USE = (
    "asyncio",
    "multiprocessing",
    "pickle",
    "email",
    "decimal",
    "fractions",
    "uuid",
    "pathlib",
)


@pytest.mark.parametrize(
    "first_use",
    [
        "with timebound.fail_after(1):\n    pass",
        "f = timebound.resilient(retry=3)(lambda: 1)\nassert f() == 1",
    ],
    ids=["fail_after", "resilient"],
)
def test_first_use_imports_only_what_it_needs(first_use: str) -> None:
    """The first scope and the first policy call import none of the heavier modules they do not
    need (each of these is imported where it is used)."""
    code = (
        "import sys, timebound\n"
        f"{first_use}\n"
        f"print(sorted(m for m in {_NOT_ON_FIRST_USE!r} if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "[]", f"imported on first use: {out}"


def test_asyncio_imported_after_a_first_sync_use_is_used_by_later_scopes() -> None:
    """A sync scope and a sync policy call first, asyncio imported afterwards: an asyncio scope
    then still cancels its task at its (spent) deadline and reports its own bound."""
    code = (
        "import sys, timebound as tb\n"
        "with tb.fail_after(5):\n    pass\n"
        "assert tb.resilient(retry=2)(lambda: 1)() == 1\n"
        "assert 'asyncio' not in sys.modules\n"
        "import asyncio\n"
        "async def main():\n"
        "    try:\n"
        "        async with tb.fail_after(0) as scope:\n"
        "            await asyncio.sleep(30)\n"
        "    except tb.DeadlineExceeded as exc:\n"
        "        return scope.expired, exc.source\n"
        "print(asyncio.run(main()))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()
    assert out == "(True, 'scope')"


def test_root_names_are_listed_once() -> None:
    """Each name in timebound.__all__ has a home module, and every such home exports it."""
    import timebound

    assert set(timebound._LOCATIONS) == set(timebound.__all__)
    assert "never_defined" not in dir(timebound)
    with pytest.raises(AttributeError, match="never_defined"):
        timebound.never_defined  # noqa: B018


def test_version_matches_the_project_metadata() -> None:
    """timebound.__version__ is the version pyproject.toml declares."""
    import tomllib

    import timebound

    project = tomllib.loads((SRC.parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    assert timebound.__version__ == project["project"]["version"]
