"""Configuration: options over environment over TOML, and the loopback rule (D8.1)."""

from __future__ import annotations

import subprocess
import sys
import types
from datetime import timedelta
from pathlib import Path

import pytest

from timebound.host import Config, ConfigError, load_config
from timebound.host._host import load_connectors

from .conftest import ROOT


def test_defaults_are_sqlite_in_the_working_directory_on_loopback() -> None:
    """With nothing configured: ./timebound.db, 127.0.0.1:8080, no token."""
    config = load_config({}, {}, None)
    assert config == Config()
    assert (config.db, config.host, config.port) == ("sqlite:///timebound.db", "127.0.0.1", 8080)


def test_command_line_beats_environment_beats_file(tmp_path: Path) -> None:
    """Each layer overrides the one below it, field by field."""
    f = tmp_path / "host.toml"
    f.write_text('[host]\nport = 7000\ndb = "sqlite:///file.db"\npage_size = 20\n')
    env = {"TIMEBOUND_PORT": "7100", "TIMEBOUND_DB": "sqlite:///env.db"}
    config = load_config({"port": "7200"}, env, str(f))
    assert (config.port, config.db, config.page_size) == (7200, "sqlite:///env.db", 20)


def test_non_loopback_address_without_token_is_refused() -> None:
    """Binding beyond loopback needs a token (D8.1)."""
    with pytest.raises(ConfigError, match="not a loopback address and no token"):
        load_config({"host": "0.0.0.0"}, {}, None)


@pytest.mark.parametrize("address", ["127.0.0.1", "127.5.5.5", "::1", "localhost"])
def test_loopback_addresses_need_no_token(address: str) -> None:
    """Every loopback spelling is accepted without a token."""
    assert load_config({"host": address}, {}, None).loopback


def test_token_from_file_allows_any_address(tmp_path: Path) -> None:
    """A token file makes 0.0.0.0 acceptable; the token is not in the config's repr."""
    (tmp_path / "t").write_text("tok-123-0123456789abcdef\n")
    config = load_config({"host": "0.0.0.0", "token_file": str(tmp_path / "t")}, {}, None)
    assert config.token == "tok-123-0123456789abcdef"
    assert "tok-123-0123456789abcdef" not in repr(config)


def test_token_from_environment(tmp_path: Path) -> None:
    """TIMEBOUND_TOKEN configures the token."""
    assert load_config({}, {"TIMEBOUND_TOKEN": "abc-0123456789abcdef"}, None).token == (
        "abc-0123456789abcdef"
    )


@pytest.mark.parametrize(
    ("options", "env", "message"),
    [
        ({"port": "http"}, {}, "port (command line): expected an integer in [0, 65535]"),
        ({}, {"TIMEBOUND_PORT": "70000"}, "port (environment): expected an integer"),
        ({}, {"TIMEBOUND_PAGE_SIZE": "0"}, "page_size (environment): expected an integer"),
        ({}, {"TIMEBOUND_DRAIN": "-1"}, "drain (environment): expected a duration in [0s, 1h]"),
        ({}, {"TIMEBOUND_DRAIN": "2 min"}, "drain (environment): expected a duration"),
        ({}, {"TIMEBOUND_WORKER": "maybe"}, "worker (environment): expected true or false"),
        ({"token_file": "/nonexistent/t"}, {}, "token_file (command line): cannot read"),
    ],
)
def test_bad_values_name_the_option_and_source(
    options: dict[str, str], env: dict[str, str], message: str
) -> None:
    """A wrong value is refused with the option and where it came from."""
    with pytest.raises(ConfigError) as info:
        load_config(options, env, None)
    assert str(info.value).startswith(message)


def test_unknown_key_in_the_file_is_refused(tmp_path: Path) -> None:
    """A misspelt key in [host] is an error, not silently ignored."""
    f = tmp_path / "host.toml"
    f.write_text("[host]\nprot = 1\n")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['prot'\]"):
        load_config({}, {}, str(f))


def test_malformed_toml_is_refused(tmp_path: Path) -> None:
    """A TOML syntax error names the file."""
    f = tmp_path / "host.toml"
    f.write_text("[host\n")
    with pytest.raises(ConfigError, match=r"host\.toml"):
        load_config({}, {}, str(f))


def _serve(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "timebound", "serve", *args],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_check_validates_definitions_and_exits(tmp_path: Path) -> None:
    """serve --check loads actions and definitions, prints them and exits 0."""
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "q.json").write_text((ROOT / "tests/host/flows/quick.json").read_text())
    r = _serve(tmp_path, "--check", "--actions", "tests.host.host_actions", "--workflows", "flows")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "configuration is valid; definitions: quick\n"


def test_check_names_the_broken_definition_file_and_field(tmp_path: Path) -> None:
    """An invalid definition stops the start with its file and field."""
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "bad.yaml").write_text("id: bad\ninitial_node: a\nnodes: 5\n")
    r = _serve(tmp_path, "--check", "--workflows", "flows")
    assert r.returncode == 2
    assert "bad.yaml" in r.stderr and "nodes" in r.stderr
    assert "Traceback" not in r.stderr


def test_serve_refuses_public_address_without_token(tmp_path: Path) -> None:
    """serve --host 0.0.0.0 without a token exits 2 with the reason."""
    r = _serve(tmp_path, "--host", "0.0.0.0")
    assert r.returncode == 2
    assert "no token is configured" in r.stderr


def test_unimportable_actions_module_is_a_usage_error(tmp_path: Path) -> None:
    """--actions naming a missing module exits 2 naming it."""
    r = _serve(tmp_path, "--check", "--actions", "no_such_module_xyz")
    assert r.returncode == 2
    assert "cannot import 'no_such_module_xyz'" in r.stderr


def test_no_worker_from_the_file_or_environment(tmp_path: Path) -> None:
    """``worker = false`` in the TOML file and ``TIMEBOUND_WORKER=0`` both turn the loop off."""
    pg = "postgresql://u@db/x"
    (tmp_path / "host.toml").write_text(f'[host]\nworker = false\ndb = "{pg}"\n')
    assert load_config({}, {}, str(tmp_path / "host.toml")).worker is False
    assert load_config({"db": pg}, {"TIMEBOUND_WORKER": "0"}, None).worker is False
    assert load_config({"db": pg}, {}, None).worker is True


def test_no_worker_on_sqlite_is_refused() -> None:
    """A host without a worker on a one-process SQLite store would never run a run: refused."""
    with pytest.raises(ConfigError, match="worker = false needs a shared PostgreSQL store"):
        load_config({"worker": False}, {}, None)


def test_connectors_and_drain_come_from_every_layer(tmp_path: Path) -> None:
    """connectors (a list, or comma/space separated) and drain follow the same layering."""
    f = tmp_path / "host.toml"
    f.write_text('[host]\nconnectors = ["a.conn"]\ndrain = "4s"\n')
    assert load_config({}, {}, str(f)).connectors == ("a.conn",)
    assert load_config({}, {}, str(f)).drain == 4.0
    env = {"TIMEBOUND_CONNECTORS": "b.conn, c.conn", "TIMEBOUND_DRAIN": "2.5"}
    config = load_config({}, env, str(f))
    assert (config.connectors, config.drain) == (("b.conn", "c.conn"), 2.5)
    config = load_config({"connectors": ["d.conn"], "drain": "1500ms"}, env, str(f))
    assert (config.connectors, config.drain) == (("d.conn",), 1.5)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"connectors": [3]}, "connectors (command line): expected a list of module names"),
        ({"drain": "-1"}, "drain (command line): expected a duration in [0s, 1h]"),
        ({"max_extension": "2d"}, None),
        ({"max_extension": "400d"}, "max_extension (command line): expected a duration"),
    ],
)
def test_bad_connectors_or_drain_name_the_setting(
    options: dict[str, object], message: str | None
) -> None:
    """A wrong connectors or drain value is refused naming the setting and its source."""
    if message is None:  # a good value, for contrast
        assert load_config(options, {}, None).max_extension == 2 * 86_400.0
        return
    with pytest.raises(ConfigError) as info:
        load_config(options, {}, None)
    assert message in str(info.value)


def test_the_old_s_names_still_work_with_a_warning_naming_the_new_ones(tmp_path: Path) -> None:
    """drain_s / max_extension_s as Python keywords and attributes, TOML keys, TIMEBOUND_*
    variables and options work for one release, each warning with the new name (D1.12)."""
    with pytest.warns(DeprecationWarning, match=r"Config\(drain_s=…\) is deprecated; pass drain="):
        config = Config(drain_s=3, max_extension="1h")
    assert (config.drain, config.max_extension) == (3.0, 3600.0)
    with pytest.warns(DeprecationWarning, match="use Config.max_extension"):
        assert config.max_extension_s == 3600.0
    f = tmp_path / "host.toml"
    f.write_text("[host]\ndrain_s = 4\n")
    with pytest.warns(
        DeprecationWarning, match=r"drain_s \(config file .*\) is deprecated; use drain"
    ):
        assert load_config({}, {}, str(f)).drain == 4.0
    with pytest.warns(DeprecationWarning, match=r"max_extension_s \(environment\) is deprecated"):
        config = load_config({}, {"TIMEBOUND_MAX_EXTENSION_S": "60"}, None)
    assert config.max_extension == 60.0
    with pytest.warns(DeprecationWarning), pytest.raises(ConfigError, match="not both"):
        load_config({}, {"TIMEBOUND_DRAIN_S": "1", "TIMEBOUND_DRAIN": "2"}, None)


def test_config_takes_durations_in_python() -> None:
    config = Config(drain=timedelta(seconds=30), max_extension="2h")
    assert (config.drain, config.max_extension) == (30.0, 7200.0)
    with pytest.raises(ConfigError, match=r"Config\(drain=…\): expected a duration"):
        Config(drain="2h")


class _Conn:
    async def status(self, op: object) -> object:
        return None

    async def cancel(self, op: object) -> object:
        return None


@pytest.mark.parametrize(
    ("made", "message"),
    [
        (lambda: [("render", _Conn())], "connectors() answered list, not a mapping"),
        (lambda: {"render": object()}, "['render']: not a connector (no status or cancel method)"),
        (lambda: {"": _Conn()}, "a deferred module name is a non-empty string"),
        (lambda: 1 / 0, "connectors() failed: ZeroDivisionError"),
    ],
)
def test_a_wrong_connectors_function_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, made: object, message: str
) -> None:
    """What connectors() answers is checked: a mapping of module names to connectors."""
    module = types.ModuleType("tb_test_conns")
    module.connectors = made  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tb_test_conns", module)
    with pytest.raises(ConfigError) as info:
        load_connectors(("tb_test_conns",))
    assert "connectors: tb_test_conns.connectors()" in str(info.value)
    assert message in str(info.value)


def test_one_module_name_in_two_connector_modules_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two modules both serving "render" would make the choice a guess: refused."""
    for name in ("tb_test_one", "tb_test_two"):
        module = types.ModuleType(name)
        module.connectors = lambda: {"render": _Conn()}  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, name, module)
    with pytest.raises(ConfigError, match="'render' has a connector in both 'tb_test_one'"):
        load_connectors(("tb_test_one", "tb_test_two"))
    assert set(load_connectors(("tb_test_one",))) == {"render"}
