"""Token strength from every source (D8.6) and the new host settings' checks (D8.5, D8.9)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from timebound.host import ConfigError, load_config

from .conftest import ROOT

STRONG = "a-strong-token-0123456789"


@pytest.mark.parametrize(
    ("token", "problem"),
    [
        ("   ", "the token is blank"),
        ("\t", "the token is blank"),
        ("x", "the token has 1 of the 16 characters it needs"),
        ("fifteen-chars-x", "the token has 15 of the 16 characters it needs"),
        ("sixteen chars with spaces", "the token contains whitespace"),
        ("sixteen-chars-\u00e9\u00e9\u00e9", "the token has characters other than printable ASCII"),
    ],
)
def test_weak_tokens_are_refused_from_the_environment(token: str, problem: str) -> None:
    """TIMEBOUND_TOKEN must be 16 printable non-space characters or more; the message names the
    source and what is wrong."""
    with pytest.raises(ConfigError) as info:
        load_config({}, {"TIMEBOUND_TOKEN": token}, None)
    assert str(info.value).startswith(f"token (environment): {problem}")
    assert "secrets.token_urlsafe" in str(info.value)


def test_a_weak_token_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    """A token file holding whitespace only, or too short a token, names the file."""
    for text in (" \n\t\n", "short\n"):
        (tmp_path / "t").write_text(text)
        with pytest.raises(ConfigError, match=r"^token_file \(command line\): '.*/t': the token"):
            load_config({"token_file": str(tmp_path / "t")}, {}, None)


def test_a_weak_token_in_the_config_file_is_refused(tmp_path: Path) -> None:
    """token = "..." in the [host] table is checked like the others."""
    f = tmp_path / "host.toml"
    f.write_text('[host]\ntoken = "   "\n')
    with pytest.raises(
        ConfigError, match=r"^token \(config file .*host\.toml\): the token is blank"
    ):
        load_config({}, {}, str(f))


def test_a_strong_token_is_kept_as_given() -> None:
    """Sixteen or more printable characters are accepted unchanged."""
    assert load_config({}, {"TIMEBOUND_TOKEN": STRONG}, None).token == STRONG
    assert load_config({}, {"TIMEBOUND_TOKEN": "x" * 16}, None).token == "x" * 16


def test_serve_exits_2_on_a_whitespace_token(tmp_path: Path) -> None:
    """`timebound serve --check` with TIMEBOUND_TOKEN="   " exits 2 naming the source; the
    host never starts with a token anyone could type."""
    r = subprocess.run(
        [sys.executable, "-m", "timebound", "serve", "--check"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "TIMEBOUND_TOKEN": "   "},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert r.stderr.startswith("timebound serve: token (environment): the token is blank")


def test_allowed_hosts_from_every_layer() -> None:
    """allowed_hosts: a list or a comma/space separated string, lower-cased."""
    env = {"TIMEBOUND_ALLOWED_HOSTS": "ops.example.com, Other.Example"}
    assert load_config({}, env, None).allowed_hosts == ("ops.example.com", "other.example")
    config = load_config({"allowed_hosts": ["a.example"]}, env, None)
    assert config.allowed_hosts == ("a.example",)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"allowed_hosts": ["https://ops.example.com"]}, "allowed_hosts (command line): "),
        ({"allowed_hosts": ["ops.example.com:8080"]}, "is not a host name"),
        ({"forwarded_allow_ips": ["proxy.internal"]}, "forwarded_allow_ips (command line): "),
    ],
)
def test_bad_host_names_and_proxy_addresses_are_refused(
    options: dict[str, object], message: str
) -> None:
    """A URL, a port or a name where an address belongs is refused naming the setting."""
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(options, {}, None)
