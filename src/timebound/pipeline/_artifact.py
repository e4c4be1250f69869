"""Artifacts: canonical JSON (RFC 8785), content-addressed fragments, the versioned schema."""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import json
from collections.abc import Mapping
from typing import Any

import rfc8785

from .._json import JSONError, SchemaValidator, TooDeep
from .._json import loads as loads_json
from ._errors import ValidationError

__all__ = ["CAPABILITY", "Artifact"]

CAPABILITY = "cap.rfc.0002.timeout_wrapper.v1"
PLAN_SCHEMA = "timebound.pipeline.plan/v1"
FRAGMENT_SCHEMA = "timebound.pipeline.fragment/v1"
# A hostile artifact is refused before it is parsed when it is larger than this.
MAX_ARTIFACT_BYTES = 16 * 1024 * 1024


def canonical(doc: Any) -> bytes:
    """RFC 8785 canonical JSON: the bytes digests are computed over and artifacts are written as.

    A number RFC 8785 cannot write (an integer past 2^53, which a hostile artifact may hold) is
    a ``schema`` ValidationError, not the encoder's own exception."""
    try:
        return rfc8785.dumps(doc)
    except rfc8785.CanonicalizationError as exc:
        raise ValidationError("schema", f"not canonical JSON: {str(exc)[:200]}") from None


def digest_of(doc: Any) -> str:
    return "sha256:" + hashlib.sha256(canonical(doc)).hexdigest()


@functools.cache
def _validator() -> SchemaValidator:
    text = importlib.resources.files(__package__).joinpath("plan.schema.json").read_text("utf-8")
    return SchemaValidator(json.loads(text))


def check_schema(doc: Any) -> None:
    """Fail-closed: raise ``ValidationError(rule="schema")`` naming the first offending field."""
    try:
        problem = _validator().first_problem(doc)
    except RecursionError:
        raise ValidationError("schema", "artifact is nested too deeply") from None
    if problem is not None:
        raise ValidationError("schema", f"artifact field {problem.path}: {problem.message}")


class Artifact:
    """A compiled plan: the plan document and the fragments it references by digest.

    ``to_json()`` gives canonical bytes with the fragments embedded; ``from_json`` loads them
    back on their own; ``digest`` addresses the plan document.
    """

    __slots__ = ("_digest", "fragments", "plan")

    def __init__(self, plan: dict[str, Any], fragments: Mapping[str, dict[str, Any]]) -> None:
        for digest, fragment in fragments.items():
            actual = digest_of(fragment)
            if actual != digest:
                raise ValidationError(
                    "schema",
                    f"fragment {digest} does not match its content ({actual})",
                    details={"expected": digest, "actual": actual},
                )
        self.plan = plan
        self.fragments: dict[str, dict[str, Any]] = dict(sorted(fragments.items()))
        self._digest = digest_of(plan)

    @property
    def digest(self) -> str:
        return self._digest

    @property
    def capabilities_required(self) -> list[str]:
        return list(self.plan["capabilities_required"])

    def to_json(self) -> bytes:
        return canonical({**self.plan, "fragments": self.fragments})

    @classmethod
    def from_json(cls, data: bytes | str) -> Artifact:
        """Load an artifact; malformed, unknown or inconsistent content is a ValidationError."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        if len(data) > MAX_ARTIFACT_BYTES:
            raise ValidationError("schema", f"artifact is larger than {MAX_ARTIFACT_BYTES} bytes")
        try:
            doc = loads_json(data, what="artifact")
        except TooDeep:
            raise ValidationError("schema", "artifact is nested too deeply") from None
        except JSONError as exc:
            raise ValidationError("schema", str(exc)) from None
        check_schema(doc)
        fragments = doc.pop("fragments", {})
        return cls(doc, fragments)

    def __repr__(self) -> str:
        return f"<Artifact {self.plan['name']!r} {self._digest}>"
