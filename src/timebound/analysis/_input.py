"""What the check reads: a file, its kind, and a module of Python policies (D14.1).

The kind comes from ``kind=`` when given, else from the file: ``.cst`` is a Constellation
program, ``.py`` a module of Python policies, and a JSON or YAML document is a pipeline plan when
its ``schema`` names one (``timebound.pipeline.plan/…``) and a workflow definition when it has
an ``initial_node``. A file is read with a cap (:data:`MAX_BYTES`) before anything parses it.
"""

from __future__ import annotations

import os
import types
from pathlib import Path
from typing import Final, Literal

from .._core._errors import ConfigurationError, InvalidInput
from .._core._modules import load_module
from .._json import loads as loads_json

__all__ = ["KINDS", "MAX_BYTES", "CheckInputError", "Kind", "detect", "import_policies", "read"]

Kind = Literal["policy", "constellation", "pipeline", "workflow"]
KINDS: Final[tuple[Kind, ...]] = ("policy", "constellation", "pipeline", "workflow")
#: The most the check reads of one file: the largest input any engine takes (a pipeline
#: artifact, 16 MiB).
MAX_BYTES: Final = 16 * 1024 * 1024


class CheckInputError(InvalidInput):
    """The check cannot read its input: a missing or unreadable file, one too large, a kind
    it cannot tell, a module that does not import. ``path`` names the input."""

    code = "check-input"

    def __init__(self, message: str, *, path: str = "") -> None:
        super().__init__(message)
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (str(self), self.path))

    @property
    def field(self) -> str | None:
        return self.path or None


def _rebuild(message: str, path: str) -> CheckInputError:
    return CheckInputError(message, path=path)


def read(path: str | os.PathLike[str]) -> str:
    """The text of ``path`` (UTF-8, a byte order mark dropped), at most :data:`MAX_BYTES`."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise CheckInputError(f"cannot read {name}: {exc.strerror or exc}", path=name) from None
    if len(data) > MAX_BYTES:
        raise CheckInputError(f"{name} is larger than {MAX_BYTES} bytes", path=name)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CheckInputError(f"cannot read {name}: not UTF-8 ({exc.reason})", path=name) from None


def detect(path: str, text: str | None) -> Kind:
    """The kind of the file at ``path`` (``text``: its content, when read)."""
    suffix = Path(path).suffix.lower()
    if suffix == ".cst":
        return "constellation"
    if suffix == ".py":
        return "policy"
    if text is not None:
        head = text.lstrip()[:1]
        if head == "{":
            # The strict reader every engine uses: a document too deep or not JSON is refused
            # here with its own clear error (an InvalidInput), before any walk of it.
            doc = loads_json(text, what=path)
            if isinstance(doc, dict):
                schema = doc.get("schema")
                if isinstance(schema, str) and schema.startswith("timebound.pipeline.plan"):
                    return "pipeline"
                if "initial_node" in doc:
                    return "workflow"
        elif suffix in (".yaml", ".yml") and "initial_node" in text:
            return "workflow"
    raise CheckInputError(
        f"{path}: cannot tell what this is (a .cst program, a .py module of policies, a "
        "pipeline plan with its 'schema', a workflow definition with its 'initial_node'); "
        "name it with --kind policy|constellation|pipeline|workflow",
        path=path,
    )


def import_policies(spec: str) -> types.ModuleType:
    """The module ``spec`` names: a dotted name, or the path of a ``.py`` file, imported by the
    one module loader every command uses (D12.3)."""
    try:
        return load_module(spec, what="policies")
    except ConfigurationError as exc:
        raise CheckInputError(str(exc), path=spec) from None
