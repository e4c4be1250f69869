"""The pipeline's renamed names: the new ones are the API, the old ones work for one release with
a ``DeprecationWarning`` naming the new one."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import warnings

import pyarrow as pa
import pytest

from timebound import ConfigurationError
from timebound import pipeline as pl


def _catalog() -> pl.Catalog:
    catalog = pl.Catalog()
    catalog.key("id", pa.int64())
    return catalog


@pytest.mark.parametrize(("old", "new"), [("Registry", "Catalog"), ("Result", "RunOutput")])
def test_old_module_names_warn_and_are_the_new_ones(old: str, new: str) -> None:
    """``pl.Registry`` is ``pl.Catalog``, ``pl.Result`` is ``pl.RunOutput``, each with a warning."""
    with pytest.warns(DeprecationWarning, match=rf"timebound\.pipeline\.{new}\b"):
        value = getattr(pl, old)
    assert value is getattr(pl, new)


def test_the_new_names_do_not_warn() -> None:
    """Code written with the new names runs without a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        catalog = _catalog()
        plan = pl.Plan("p", catalog=catalog)
        engine = pl.Engine(catalog)
        assert plan.catalog is catalog and engine.catalog is catalog
        out = engine.run_sync(pl.compile(plan), pa.table({"id": [1, 2]}))
        assert isinstance(out, pl.RunOutput)


def test_the_registry_keyword_warns() -> None:
    """``Plan(registry=...)`` and ``Engine(registry=...)`` still work, naming ``catalog=``."""
    catalog = _catalog()
    with pytest.warns(
        DeprecationWarning, match=r"Plan\(registry=…\) is deprecated; pass catalog= \(a pl\.Catalog"
    ):
        plan = pl.Plan("p", registry=catalog)  # type: ignore[call-arg]
    with pytest.warns(
        DeprecationWarning, match=r"Engine\(registry=…\) is deprecated; pass catalog="
    ):
        engine = pl.Engine(registry=catalog)  # type: ignore[call-arg]
    assert plan.catalog is catalog and engine.catalog is catalog


def test_the_registry_attribute_warns() -> None:
    """``.registry`` of a plan and of an engine is the catalog, with a warning."""
    catalog = _catalog()
    with pytest.warns(DeprecationWarning, match=r"Plan\.registry is now Plan\.catalog"):
        assert pl.Plan("p", catalog=catalog).registry is catalog
    with pytest.warns(DeprecationWarning, match=r"Engine\.registry is now Engine\.catalog"):
        assert pl.Engine(catalog).registry is catalog


def test_both_keywords_or_none_is_a_clear_error() -> None:
    """Giving the catalog twice, or something else, names what to write."""
    catalog = _catalog()
    with pytest.raises(ConfigurationError, match="got both registry= and catalog="):
        pl.Plan("p", catalog=catalog, registry=catalog)  # type: ignore[call-arg]
    with pytest.raises(ConfigurationError, match=r"catalog must be a pl\.Catalog"):
        pl.Engine(object())  # type: ignore[arg-type]


def test_the_cli_still_accepts_registry(tmp_path: pathlib.Path) -> None:
    """``timebound pipeline validate ... --registry M:N`` is the old spelling of ``--catalog``."""
    (tmp_path / "rank.py").write_text(
        "import pyarrow as pa\nfrom timebound import pipeline as pl\n"
        "reg = pl.Catalog()\nreg.key('id', pa.int64())\nplan = pl.Plan('p', catalog=reg)\n",
        encoding="utf-8",
    )
    run = [sys.executable, "-m", "timebound"]
    compiled = subprocess.run(
        [*run, "pipeline", "compile", "rank:plan", "-o", "a.json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert compiled.returncode == 0, compiled.stderr
    for flag in ("--catalog", "--registry"):
        done = subprocess.run(
            [*run, "pipeline", "validate", "a.json", flag, "rank:reg"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, (flag, done.stderr)
