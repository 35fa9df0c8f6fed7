"""Configuration: every option as TOML key, flag and RELAYPROXY_* variable, with flag > env > file > default."""

from __future__ import annotations

import argparse

import pytest

from relayproxy.commands import config


def parse(argv):
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return parser.parse_args(argv)


def test_every_option_has_flag_env_and_toml_forms(tmp_path):
    for option in config.OPTIONS:
        assert option.flag.startswith("--") and option.env.startswith("RELAYPROXY_")
    toml = tmp_path / "relay.toml"
    toml.write_text('master = "db1:3306"\nserver-id = 7\nrelay_dir = "/var/lib/relay"\ngtid_mode = "mariadb"\n')
    cfg = config.load(parse(["--config", str(toml)]), environ={})
    assert cfg.master == ("db1", 3306) and cfg.server_id == 7 and cfg.gtid_mode == "mariadb"
    assert cfg.relay_dir == "/var/lib/relay" and cfg.sync_mode == "transaction"


def test_precedence_flag_over_env_over_file(tmp_path):
    toml = tmp_path / "relay.toml"
    toml.write_text('server_id = 1\nuser = "from_file"\nheartbeat_period = 5\n')
    env = {"RELAYPROXY_SERVER_ID": "2", "RELAYPROXY_USER": "from_env"}
    cfg = config.load(parse(["--config", str(toml), "--server-id", "3"]), environ=env)
    assert cfg.server_id == 3 and cfg.sources["server_id"] == "flag --server-id"
    assert cfg.user == "from_env" and cfg.heartbeat_period == 5.0
    cfg = config.load(parse([]), environ={"RELAYPROXY_CONFIG": str(toml)})
    assert cfg.user == "from_file"


def test_bad_values_name_option_and_source(tmp_path):
    with pytest.raises(config.ConfigError, match=r"invalid master 'nohost' from flag --master"):
        config.load(parse(["--master", "nohost"]), environ={})
    with pytest.raises(config.ConfigError, match=r"invalid gtid_mode .* environment RELAYPROXY_GTID_MODE"):
        config.load(parse([]), environ={"RELAYPROXY_GTID_MODE": "sometimes"})
    toml = tmp_path / "bad.toml"
    toml.write_text("no_such_option = 1\n")
    with pytest.raises(config.ConfigError, match="unknown option 'no_such_option'"):
        config.load(parse(["--config", str(toml)]), environ={})
    toml.write_text("server_id = [\n")
    with pytest.raises(config.ConfigError, match="not valid TOML"):
        config.load(parse(["--config", str(toml)]), environ={})
    with pytest.raises(config.ConfigError, match="server id must be"):
        config.load(parse(["--server-id", "0"]), environ={})


def test_required_options_and_secrets(tmp_path):
    cfg = config.load(parse(["--password", "s3cret"]), environ={})
    with pytest.raises(config.ConfigError, match="master .*--master.*RELAYPROXY_MASTER"):
        cfg.require("master", "server_id")
    assert cfg.public_dict()["password"] == "***"
    with pytest.raises(config.ConfigError) as err:
        config.load(parse(["--password", "s3cret", "--server-id", "x"]), environ={})
    assert "s3cret" not in str(err.value)
    pw = tmp_path / "pw"
    pw.write_text("from-file\n")
    assert config.load(parse(["--password-file", str(pw)]), environ={}).resolved_password() == "from-file"
    assert config.load(parse([]), environ={"RELAYPROXY_PASSWORD": "env-pw"}).resolved_password() == "env-pw"
