"""Importing the user's code named on a command line or in a configuration file (D12.3).

One rule for every command and for ``timebound serve``: a name with a path separator or ending in
``.py`` is a file, imported under its own name from its own directory (as ``python shop.py`` sees
its neighbours: ``./lib/shop.py`` is ``shop`` run from ``lib``); any other name is a dotted module
name, found from the current directory first when it is not on the path yet (as with
``python -m``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pathlib
import sys
import types

from ._errors import ConfigurationError

__all__ = ["is_module_path", "load_module"]


def is_module_path(spec: str) -> bool:
    """Whether ``spec`` names a file rather than a dotted module name."""
    return spec.endswith(".py") or "/" in spec or os.sep in spec


def load_module(spec: str, *, what: str = "module") -> types.ModuleType:
    """Import ``spec``: a dotted module name (``shop``, ``pkg.shop``) or the path of a ``.py``
    file (``shop.py``, ``./lib/shop.py``).

    ``what`` names the option or setting that gave ``spec`` (``--actions``) in the
    :class:`~timebound.ConfigurationError` raised when it cannot be imported; whatever the module
    raised as it loaded is named in the message.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigurationError(
            f"{what}: a module is a dotted name or a .py file, not {spec!r}", option=what
        )
    if is_module_path(spec):
        return _load_file(spec, what)
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(spec)
    except Exception as exc:  # ImportError, but also whatever the module raises as it loads
        raise _cannot(spec, what, exc) from None


def _load_file(spec: str, what: str) -> types.ModuleType:
    path = pathlib.Path(spec)
    if path.suffix != ".py" or not path.is_file():
        raise ConfigurationError(
            f"{what} {spec}: no such Python file; give a file such as shop.py or "
            "./lib/shop.py, or a module name such as shop",
            option=what,
        )
    name = path.stem
    if not name.isidentifier():
        raise ConfigurationError(
            f"{what} {spec}: {name!r} cannot be a module name (letters, digits and _)",
            option=what,
        )
    file = path.resolve()
    # Its neighbours import as they would under `python shop.py`.
    directory = str(file.parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    loaded = sys.modules.get(name)
    if loaded is not None and _file_of(loaded) == file:
        return loaded
    # The file itself, never another module of that name found first on the path. Registered
    # under its name (so what it defines can be found by module and name) unless that name is
    # taken already (./json.py, or another file of the same name loaded earlier): then it is
    # loaded on its own rather than replacing a module other code uses.
    register = loaded is None
    loader_spec = importlib.util.spec_from_file_location(name, file)
    if loader_spec is None or loader_spec.loader is None:
        raise ConfigurationError(f"{what} {spec}: cannot be loaded as Python", option=what)
    module = importlib.util.module_from_spec(loader_spec)
    if register:
        sys.modules[name] = module
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:  # whatever the module raises as it loads
        if register:
            sys.modules.pop(name, None)
        raise _cannot(spec, what, exc) from None
    return module


def _cannot(spec: str, what: str, exc: BaseException) -> ConfigurationError:
    return ConfigurationError(
        f"{what}: cannot import {spec!r}: {type(exc).__name__}: {exc}", option=what
    )


def _file_of(module: types.ModuleType) -> pathlib.Path | None:
    file = getattr(module, "__file__", None)
    return None if file is None else pathlib.Path(file).resolve()
