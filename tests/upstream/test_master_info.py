"""Tests for the relay's durable choice of master (relay/master_info.py): the file, CHANGE MASTER semantics and the
precedence of a CHANGE MASTER over --master at restart."""

from __future__ import annotations

import dataclasses
import json
import os
import stat

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relayproxy.downstream.sql.replication_parser import parse_admin_statement
from relayproxy.relay import master_info as mi
from relayproxy.relay.master_info import (
    FILE_NAME,
    MasterChoiceError,
    MasterIdentity,
    MasterInfo,
    MasterInfoError,
    MasterInfoFile,
    apply_change,
    effective_master,
)

SECRET = "Sup3r-s3cret"
T0 = 1795603800.0  # 2026-11-25T10:50:00Z


def info(**kw) -> MasterInfo:
    values = {"host": "db1", "port": 3306, "user": "repl", "password": SECRET}
    values.update(kw)
    return MasterInfo(**values)


IDENTITY = MasterIdentity(server_id=11, server_uuid="3e11fa47-71ca-11e1-9e33-c80aa9429562", flavour="mysql",
                          host="db2", port=3307)


def options(sql: str) -> dict:
    return parse_admin_statement(sql).options


# ---------------------------------------------------------------------------------------------
# MasterInfo: repr, describe


def test_repr_str_and_describe_never_show_the_password():
    m = info(source="change_master", changed_at=T0)
    for text in (repr(m), str(m), f"{m}", repr([m]), json.dumps(m.describe())):
        assert SECRET not in text
    assert "password" not in repr(m)
    d = m.describe()
    assert d["password_set"] is True and "password" not in d
    assert d["changed_at"] == "2026-11-25T10:50:00Z"
    assert d["host"] == "db1" and d["port"] == 3306 and d["gtid_mode"] == "off" and d["source"] == "change_master"
    assert sorted(d) == sorted(["host", "port", "user", "password_set", "ssl_mode", "ssl_ca", "ssl_capath",
                                "ssl_cert", "ssl_key", "ssl_cipher", "public_key_path", "get_public_key",
                                "connect_retry", "heartbeat_period", "gtid_mode", "log_file", "log_pos", "source",
                                "unfollowed",
                                "changed_at"])
    assert info(password="").describe()["password_set"] is False
    assert info().describe()["changed_at"] is None


def test_master_info_is_frozen_and_compares_the_password():
    with pytest.raises(AttributeError):
        info().host = "x"  # type: ignore[misc]
    assert info() != info(password="other")
    assert info(host="::1").address == "[::1]:3306"


# ---------------------------------------------------------------------------------------------
# MasterInfoFile


def test_missing_file_loads_as_nothing(tmp_path):
    assert MasterInfoFile(tmp_path).load() == (None, None)


def test_round_trip_of_choice_and_identity(tmp_path):
    f = MasterInfoFile(tmp_path)
    choice = info(host="db2", port=3307, ssl_mode="verify_ca", ssl_ca="/ca.pem", connect_retry=5,
                  heartbeat_period=0.5, gtid_mode="mysql", source="change_master", changed_at=T0)
    f.save_choice(choice)
    f.save_identity(IDENTITY)
    assert MasterInfoFile(tmp_path).load() == (choice, IDENTITY)
    # each save keeps the other part, also when a fresh object saves
    g = MasterInfoFile(tmp_path)
    g.save_identity(MasterIdentity(12, None, "mariadb", "db3", 3306))
    assert MasterInfoFile(tmp_path).load() == (choice, MasterIdentity(12, None, "mariadb", "db3", 3306))
    h = MasterInfoFile(tmp_path)
    other = info(host="db4", source="change_master", changed_at=T0 + 60)
    h.save_choice(other)
    assert MasterInfoFile(tmp_path).load() == (other, MasterIdentity(12, None, "mariadb", "db3", 3306))


def test_file_layout_and_version(tmp_path):
    f = MasterInfoFile(tmp_path)
    f.save_choice(info(source="change_master", changed_at=T0))
    data = json.loads((tmp_path / FILE_NAME).read_text())
    assert data["version"] == 1
    assert data["identity"] is None
    assert data["choice"]["host"] == "db1" and data["choice"]["password"] == SECRET
    assert f.path == tmp_path / "relayproxy.master.json"


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077])
def test_file_mode_is_0600_whatever_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        f = MasterInfoFile(tmp_path)
        f.save_choice(info(source="change_master", changed_at=T0))
        assert stat.S_IMODE(os.stat(f.path).st_mode) == 0o600
        f.save_identity(IDENTITY)
        assert stat.S_IMODE(os.stat(f.path).st_mode) == 0o600
    finally:
        os.umask(old)


def test_a_leftover_temp_file_is_ignored_and_removed_by_the_next_save(tmp_path):
    f = MasterInfoFile(tmp_path)
    choice = info(source="change_master", changed_at=T0)
    f.save_choice(choice)
    leftover = tmp_path / f".{FILE_NAME}.4242.deadbeef.tmp"
    leftover.write_text('{"version": 1, "choice": {"host": "half')  # a crash mid-write
    assert MasterInfoFile(tmp_path).load() == (choice, None)
    f.save_identity(IDENTITY)
    assert not leftover.exists()
    assert sorted(os.listdir(tmp_path)) == [FILE_NAME]


def test_a_failed_rename_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch):
    f = MasterInfoFile(tmp_path)
    choice = info(source="change_master", changed_at=T0)
    f.save_choice(choice)

    def failing_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mi.os, "replace", failing_replace)
    with pytest.raises(MasterInfoError) as err:
        f.save_choice(info(host="db9", password="other-secret", source="change_master", changed_at=T0))
    assert str(err.value) == f"cannot write master info file {tmp_path / FILE_NAME}: No space left on device"
    monkeypatch.undo()
    assert MasterInfoFile(tmp_path).load() == (choice, None)
    assert sorted(os.listdir(tmp_path)) == [FILE_NAME]


@pytest.mark.parametrize("cut", [1, 10, 40, -2])
def test_a_truncated_file_names_the_file_and_never_the_password(tmp_path, cut):
    MasterInfoFile(tmp_path).save_choice(info(source="change_master", changed_at=T0))
    path = tmp_path / FILE_NAME
    text = path.read_text()
    path.write_text(text[:cut])
    with pytest.raises(MasterInfoError) as err:
        MasterInfoFile(tmp_path).load()
    message = str(err.value)
    assert message.startswith(f"master info file {path} is not valid JSON (")
    assert "truncated or damaged; remove it to fall back to the configured master" in message
    assert SECRET not in message


def test_an_empty_or_binary_file_is_damaged(tmp_path):
    path = tmp_path / FILE_NAME
    path.write_bytes(b"")
    with pytest.raises(MasterInfoError, match="is not valid JSON"):
        MasterInfoFile(tmp_path).load()
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(MasterInfoError) as err:
        MasterInfoFile(tmp_path).load()
    assert str(err.value) == (f"master info file {path} is not UTF-8 text: damaged; remove it to fall back to the "
                              "configured master")


@pytest.mark.parametrize("document, message", [
    ({"version": 2, "choice": None, "identity": None},
     "has version 2; this relayproxy reads version 1 (written by another relayproxy release?)"),
    ({"choice": None, "identity": None}, "has version None; this relayproxy reads version 1"),
    ({"version": "1"}, "has version str; this relayproxy reads version 1"),
    ([1, 2], "must hold a JSON object"),
    ({"version": 1, "choice": None, "extra": 1}, ": unknown fields extra"),
])
def test_unknown_versions_and_shapes_are_refused(tmp_path, document, message):
    (tmp_path / FILE_NAME).write_text(json.dumps(document))
    with pytest.raises(MasterInfoError) as err:
        MasterInfoFile(tmp_path).load()
    assert str(err.value).startswith(f"master info file {tmp_path / FILE_NAME}")
    assert message in str(err.value)


def _saved_document(tmp_path) -> dict:
    MasterInfoFile(tmp_path).save_choice(info(source="change_master", changed_at=T0))
    MasterInfoFile(tmp_path).save_identity(IDENTITY)
    return json.loads((tmp_path / FILE_NAME).read_text())


@pytest.mark.parametrize("section, key, value, message", [
    ("choice", "port", "3306", "'choice.port' must be int, found str"),
    ("choice", "port", 0, "'choice.port' must be 1..65535"),
    ("choice", "password", 5, "'choice.password' must be str, found int"),
    ("choice", "host", None, "'choice.host' must be str, found null"),
    ("choice", "get_public_key", 1, "'choice.get_public_key' must be bool, found int"),
    ("choice", "connect_retry", True, "'choice.connect_retry' must be int or null, found bool"),
    ("choice", "gtid_mode", "on", "'choice.gtid_mode' must be one of off, mysql, mariadb"),
    ("choice", "ssl_mode", "maybe", "'choice.ssl_mode' must be one of disabled, preferred, required"),
    ("choice", "heartbeat_period", float("nan"), "'choice.heartbeat_period' must be 0..4294967"),
    ("choice", "log_pos", 2, "'choice.log_pos' must be 4..18446744073709551615"),
    ("identity", "server_id", "11", "'identity.server_id' must be int, found str"),
    ("identity", "flavour", "postgres", "'identity.flavour' must be one of mysql, mariadb"),
])
def test_wrong_field_types_name_the_field_never_the_value(tmp_path, section, key, value, message):
    document = _saved_document(tmp_path)
    document[section][key] = value
    (tmp_path / FILE_NAME).write_text(json.dumps(document))
    with pytest.raises(MasterInfoError) as err:
        MasterInfoFile(tmp_path).load()
    assert message in str(err.value)
    assert str(err.value).startswith(f"master info file {tmp_path / FILE_NAME}: ")
    assert SECRET not in str(err.value)


def test_a_password_in_the_wrong_field_is_not_quoted(tmp_path):
    document = _saved_document(tmp_path)
    document["choice"]["port"] = SECRET
    document["choice"]["surprise"] = SECRET
    (tmp_path / FILE_NAME).write_text(json.dumps(document))
    with pytest.raises(MasterInfoError) as err:
        MasterInfoFile(tmp_path).load()
    assert str(err.value) == (f"master info file {tmp_path / FILE_NAME}: 'choice' has the wrong fields "
                              "(unknown surprise)")
    del document["choice"]["surprise"]
    del document["choice"]["user"]
    (tmp_path / FILE_NAME).write_text(json.dumps(document))
    with pytest.raises(MasterInfoError) as err:
        MasterInfoFile(tmp_path).load()
    assert str(err.value).endswith("'choice' has the wrong fields (missing user)")


def test_an_unreadable_file_names_the_file(tmp_path):
    (tmp_path / FILE_NAME).mkdir()  # unreadable as a file, even for root
    with pytest.raises(MasterInfoError) as err:
        MasterInfoFile(tmp_path).load()
    assert str(err.value) == f"cannot read master info file {tmp_path / FILE_NAME}: Is a directory"


def test_save_refuses_to_overwrite_a_damaged_file(tmp_path):
    (tmp_path / FILE_NAME).write_text("{")
    with pytest.raises(MasterInfoError, match="is not valid JSON"):
        MasterInfoFile(tmp_path).save_identity(IDENTITY)
    assert (tmp_path / FILE_NAME).read_text() == "{"


def test_clear_forgets_everything(tmp_path):
    f = MasterInfoFile(tmp_path)
    f.save_choice(info(source="change_master", changed_at=T0))
    f.clear()
    assert not (tmp_path / FILE_NAME).exists()
    assert MasterInfoFile(tmp_path).load() == (None, None)
    f.clear()  # idempotent
    f.save_identity(IDENTITY)
    assert MasterInfoFile(tmp_path).load() == (None, IDENTITY)


_names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)
_paths = st.one_of(st.none(), _names)
master_infos = st.builds(
    MasterInfo,
    host=_names, port=st.integers(1, 65535), user=st.text(max_size=10), password=st.text(max_size=40),
    ssl_mode=st.sampled_from(mi.SSL_MODES), ssl_ca=_paths, ssl_capath=_paths, ssl_cert=_paths, ssl_key=_paths,
    ssl_cipher=_paths, public_key_path=_paths, get_public_key=st.booleans(),
    connect_retry=st.one_of(st.none(), st.integers(0, 2 ** 32 - 1)),
    heartbeat_period=st.floats(0, 4294967, allow_nan=False), gtid_mode=st.sampled_from(mi.GTID_MODES),
    log_file=_paths, log_pos=st.one_of(st.none(), st.integers(4, 2 ** 64 - 1)),
    source=st.sampled_from(["config", "change_master"]), changed_at=st.floats(0, 4e9, allow_nan=False),
)
identities = st.one_of(st.none(), st.builds(
    MasterIdentity, server_id=st.integers(0, 2 ** 32 - 1), server_uuid=st.one_of(st.none(), _names),
    flavour=st.sampled_from(["mysql", "mariadb"]), host=_names, port=st.integers(1, 65535)))


@settings(max_examples=150, deadline=None)
@given(master_infos, identities)
def test_any_master_info_survives_the_file(tmp_path_factory, choice, identity):
    directory = tmp_path_factory.mktemp("mi")
    f = MasterInfoFile(directory)
    f.save_choice(choice)
    if identity is not None:
        f.save_identity(identity)
    assert MasterInfoFile(directory).load() == (choice, identity)
    # The password is not in the repr: another password gives the same text (the other fields are any text, the
    # word "password" included).
    assert repr(choice) == repr(dataclasses.replace(choice, password=choice.password + "x"))
    assert choice.describe()["password_set"] is bool(choice.password)


# ---------------------------------------------------------------------------------------------
# apply_change: CHANGE MASTER semantics


def test_options_not_given_keep_their_values():
    current = info(connect_retry=7, heartbeat_period=2.0, ssl_mode="required", gtid_mode="mariadb")
    new = apply_change(current, options("CHANGE MASTER TO MASTER_PASSWORD='new'"), flavour="mariadb", now=T0)
    assert new == info(password="new", connect_retry=7, heartbeat_period=2.0, ssl_mode="required",
                       gtid_mode="mariadb", source="change_master", changed_at=T0, unfollowed=True)


def test_a_failover_repoint_keeps_the_account_and_takes_the_new_host():
    current = info(source="config", gtid_mode="mysql", log_file="binlog.000003", log_pos=4711)
    cmd = options("CHANGE REPLICATION SOURCE TO SOURCE_HOST='db2', SOURCE_AUTO_POSITION=1")
    new = apply_change(current, cmd, flavour="mysql", now=T0)
    assert (new.host, new.port, new.user, new.password) == ("db2", 3306, "repl", SECRET)
    assert (new.gtid_mode, new.log_file, new.log_pos) == ("mysql", None, None)
    assert (new.source, new.changed_at) == ("change_master", T0)


@pytest.mark.parametrize("sql", ["CHANGE MASTER TO MASTER_HOST='db1'", "CHANGE MASTER TO MASTER_PORT=3306"])
def test_specifying_host_or_port_forgets_file_and_position(sql):
    current = info(log_file="binlog.000003", log_pos=4711)
    new = apply_change(current, options(sql), flavour="mysql", now=T0)
    assert (new.log_file, new.log_pos) == (None, None)


def test_host_with_coordinates_takes_them():
    current = info(log_file="binlog.000003", log_pos=4711)
    new = apply_change(current, options("CHANGE MASTER TO MASTER_HOST='db2', MASTER_LOG_FILE='b.000009', "
                                        "MASTER_LOG_POS=120"), flavour="mysql", now=T0)
    assert (new.host, new.log_file, new.log_pos) == ("db2", "b.000009", 120)


def test_log_file_alone_starts_at_4_and_log_pos_alone_moves_within_the_file():
    current = info(log_file="binlog.000003", log_pos=4711)
    new = apply_change(current, options("CHANGE MASTER TO MASTER_LOG_FILE='binlog.000004'"), flavour="mysql", now=T0)
    assert (new.log_file, new.log_pos) == ("binlog.000004", 4)
    new = apply_change(current, options("CHANGE MASTER TO MASTER_LOG_POS=900"), flavour="mysql", now=T0)
    assert (new.log_file, new.log_pos) == ("binlog.000003", 900)


def test_log_pos_without_any_file_is_refused():
    with pytest.raises(MasterChoiceError) as err:
        apply_change(info(), {"log_pos": 120}, flavour="mysql", now=T0)
    assert (err.value.code, err.value.sqlstate) == (1210, "HY000")
    assert err.value.message.startswith("Incorrect arguments to MASTER_LOG_POS")


@pytest.mark.parametrize("flavour, sql, gtid_mode", [
    ("mysql", "CHANGE MASTER TO MASTER_AUTO_POSITION=1", "mysql"),
    ("mysql", "CHANGE MASTER TO SOURCE_AUTO_POSITION=0", "off"),
    ("mariadb", "CHANGE MASTER TO MASTER_USE_GTID=slave_pos", "mariadb"),
    ("mariadb", "CHANGE MASTER TO MASTER_USE_GTID=current_pos", "mariadb"),
    ("mariadb", "CHANGE MASTER TO MASTER_USE_GTID=no", "off"),
])
def test_gtid_options_map_to_gtid_mode(flavour, sql, gtid_mode):
    assert apply_change(info(), options(sql), flavour=flavour, now=T0).gtid_mode == gtid_mode


def test_mariadb_coordinates_imply_use_gtid_no_as_mariadb_does():
    current = info(gtid_mode="mariadb")
    new = apply_change(current, options("CHANGE MASTER TO MASTER_LOG_FILE='b.1', MASTER_LOG_POS=4"),
                       flavour="mariadb", now=T0)
    assert (new.gtid_mode, new.log_file, new.log_pos) == ("off", "b.1", 4)


def test_mysql_coordinates_while_auto_position_is_on_are_1776():
    with pytest.raises(MasterChoiceError) as err:
        apply_change(info(gtid_mode="mysql"), options("CHANGE MASTER TO MASTER_LOG_FILE='b.1', MASTER_LOG_POS=4"),
                     flavour="mysql", now=T0)
    assert (err.value.code, err.value.sqlstate) == (1776, "HY000")
    assert "MASTER_LOG_FILE, MASTER_LOG_POS" in err.value.message
    new = apply_change(info(gtid_mode="mysql"), options("CHANGE MASTER TO MASTER_AUTO_POSITION=0, "
                                                        "MASTER_LOG_FILE='b.1', MASTER_LOG_POS=4"),
                       flavour="mysql", now=T0)
    assert (new.gtid_mode, new.log_file, new.log_pos) == ("off", "b.1", 4)


def test_the_other_flavours_gtid_option_is_refused():
    with pytest.raises(MasterChoiceError) as err:
        apply_change(info(), {"use_gtid": "slave_pos"}, flavour="mysql", now=T0)
    assert err.value.code == 1210 and err.value.message.startswith("Incorrect arguments to MASTER_USE_GTID")
    with pytest.raises(MasterChoiceError) as err:
        apply_change(info(), {"auto_position": True}, flavour="mariadb", now=T0)
    assert err.value.code == 1210 and err.value.message.startswith("Incorrect arguments to MASTER_AUTO_POSITION")
    with pytest.raises(MasterChoiceError) as err:
        apply_change(info(gtid_mode="mariadb"), {"log_pos": 5, "log_file": "b.1", "use_gtid": "slave_pos"},
                     flavour="mariadb", now=T0)
    assert err.value.code == 1210


@pytest.mark.parametrize("current, sql, missing", [
    (None, "CHANGE MASTER TO MASTER_USER='repl'", "MASTER_HOST"),
    (None, "CHANGE MASTER TO MASTER_HOST='db2'", "MASTER_USER"),
    (info(user=""), "CHANGE MASTER TO MASTER_PORT=3307", "MASTER_USER"),
])
def test_missing_host_or_user_is_refused_naming_it(current, sql, missing):
    with pytest.raises(MasterChoiceError) as err:
        apply_change(current, options(sql), flavour="mysql", now=T0)
    assert (err.value.code, err.value.sqlstate) == (1200, "HY000")
    assert err.value.message == ("The server is not configured as slave; fix in config file or with CHANGE MASTER "
                                 f"TO ({missing} is not set)")


def test_port_zero_is_refused():
    with pytest.raises(MasterChoiceError) as err:
        apply_change(info(), {"port": 0}, flavour="mysql", now=T0)
    assert (err.value.code, err.value.message) == (
        1210, "Incorrect arguments to MASTER_PORT (0 is not a TCP port: 1..65535)")


def test_a_first_change_master_defaults_port_and_heartbeat():
    new = apply_change(None, options(f"CHANGE MASTER TO MASTER_HOST='db2', MASTER_USER='r', "
                                     f"MASTER_PASSWORD='{SECRET}'"), flavour="mariadb", now=T0)
    assert new == MasterInfo(host="db2", port=3306, user="r", password=SECRET, source="change_master",
                             changed_at=T0, unfollowed=True)
    assert new.heartbeat_period == 1.0 and new.ssl_mode == "preferred" and new.gtid_mode == "off"


@pytest.mark.parametrize("current_mode, sql, mode", [
    ("preferred", "CHANGE MASTER TO MASTER_SSL=1", "required"),
    ("preferred", "CHANGE MASTER TO MASTER_SSL=1, MASTER_SSL_CA='/ca'", "verify_ca"),
    ("preferred", "CHANGE MASTER TO MASTER_SSL=1, MASTER_SSL_CAPATH='/cas'", "verify_ca"),
    ("preferred", "CHANGE MASTER TO MASTER_SSL=1, MASTER_SSL_VERIFY_SERVER_CERT=1", "verify_identity"),
    ("preferred", "CHANGE MASTER TO MASTER_SSL_CA='/ca'", "preferred"),
    ("required", "CHANGE MASTER TO MASTER_SSL=0", "disabled"),
    ("required", "CHANGE MASTER TO MASTER_SSL_CA='/ca'", "verify_ca"),
    ("verify_identity", "CHANGE MASTER TO MASTER_SSL_VERIFY_SERVER_CERT=0", "required"),
    ("disabled", "CHANGE MASTER TO MASTER_SSL_VERIFY_SERVER_CERT=1", "disabled"),
    ("verify_ca", "CHANGE MASTER TO MASTER_HOST='db2'", "verify_ca"),
])
def test_tls_options_map_to_ssl_mode(current_mode, sql, mode):
    new = apply_change(info(ssl_mode=current_mode), options(sql), flavour="mysql", now=T0)
    assert new.ssl_mode == mode


def test_every_copied_option_lands_in_its_field():
    cmd = options("CHANGE MASTER TO MASTER_HOST='db2', MASTER_PORT=3307, MASTER_USER='u', MASTER_PASSWORD='p', "
                  "MASTER_SSL_CA='/ca', MASTER_SSL_CAPATH='/cas', MASTER_SSL_CERT='/c', MASTER_SSL_KEY='/k', "
                  "MASTER_SSL_CIPHER='AES', MASTER_CONNECT_RETRY=9, MASTER_HEARTBEAT_PERIOD=3, "
                  "MASTER_PUBLIC_KEY_PATH='/pub', GET_MASTER_PUBLIC_KEY=1")
    new = apply_change(None, cmd, flavour="mysql", now=T0)
    assert new == MasterInfo(host="db2", port=3307, user="u", password="p", ssl_ca="/ca", ssl_capath="/cas",
                             ssl_cert="/c", ssl_key="/k", ssl_cipher="AES", connect_retry=9, heartbeat_period=3.0,
                             public_key_path="/pub", get_public_key=True, source="change_master", changed_at=T0,
                             unfollowed=True)
    assert type(new.heartbeat_period) is float


def test_unknown_keys_and_flavours_are_programming_errors():
    with pytest.raises(ValueError, match="unknown CHANGE MASTER option keys: hostt"):
        apply_change(info(), {"hostt": "x"}, flavour="mysql")
    with pytest.raises(ValueError, match="flavour must be"):
        apply_change(info(), {}, flavour="oracle")


def test_changed_at_defaults_to_now():
    import time

    before = time.time()
    new = apply_change(info(), {"port": 3307}, flavour="mysql")
    assert before <= new.changed_at <= time.time()


# ---------------------------------------------------------------------------------------------
# effective_master: precedence at restart

CONFIG = {"master": ("127.0.0.1", 3306), "user": "repl", "password": "cfg-pass", "ssl_mode": "required",
          "ssl_ca": "/ca.pem", "ssl_cert": None, "ssl_key": None, "heartbeat_period": 2.0, "gtid_mode": "mariadb"}


def test_change_master_overrides_the_command_line():
    chosen = info(host="db2", source="change_master", changed_at=T0)
    effective, reason = effective_master(CONFIG, chosen, config_sources={"master": "flag --master"})
    assert effective is chosen
    assert reason == ("CHANGE MASTER at 2026-11-25T10:50:00Z to db2:3306 overrides --master 127.0.0.1:3306 from "
                      "the command line (RESET SLAVE ALL returns to it)")


@pytest.mark.parametrize("source, phrase", [
    ("environment RELAYPROXY_MASTER", " from environment RELAYPROXY_MASTER"),
    ("config file /etc/relay.toml", " from config file /etc/relay.toml"),
    (None, ""),
])
def test_the_reason_says_where_the_configured_master_came_from(source, phrase):
    chosen = info(host="db2", source="change_master", changed_at=T0)
    sources = {"master": source} if source else None
    _, reason = effective_master(CONFIG, chosen, config_sources=sources)
    assert reason == (f"CHANGE MASTER at 2026-11-25T10:50:00Z to db2:3306 overrides --master 127.0.0.1:3306{phrase} "
                      "(RESET SLAVE ALL returns to it)")


def test_change_master_without_any_configured_master():
    chosen = info(host="::1", port=3310, source="change_master", changed_at=T0)
    effective, reason = effective_master({"master": None}, chosen)
    assert effective is chosen
    assert reason == "CHANGE MASTER at 2026-11-25T10:50:00Z to [::1]:3310 (no --master configured)"


def test_without_change_master_the_configuration_is_in_force():
    effective, reason = effective_master(CONFIG, None, config_sources={"master": "flag --master"})
    assert effective == MasterInfo(host="127.0.0.1", port=3306, user="repl", password="cfg-pass",
                                   ssl_mode="required", ssl_ca="/ca.pem", heartbeat_period=2.0,
                                   gtid_mode="mariadb", source="config", changed_at=0.0)
    assert reason == "--master 127.0.0.1:3306 from the command line (no CHANGE MASTER recorded)"
    assert "cfg-pass" not in reason and "cfg-pass" not in repr(effective)


def test_configuration_defaults_and_start_file():
    effective, _ = effective_master({"master": ("db1", 3306), "user": "r", "start_file": "binlog.000007",
                                     "server_public_key": "/pub.pem"}, None)
    assert effective == MasterInfo(host="db1", port=3306, user="r", password="", ssl_mode="preferred",
                                   heartbeat_period=1.0, gtid_mode="off", log_file="binlog.000007", log_pos=4,
                                   public_key_path="/pub.pem", source="config", changed_at=0.0)


def test_a_saved_configuration_copy_does_not_override_the_configuration():
    saved = info(host="old", source="config")
    effective, reason = effective_master(CONFIG, saved)
    assert effective.host == "127.0.0.1" and reason.startswith("--master 127.0.0.1:3306")


def test_no_master_anywhere_is_1200():
    with pytest.raises(MasterChoiceError) as err:
        effective_master({}, None)
    assert (err.value.code, err.value.sqlstate) == (1200, "HY000")
    assert err.value.message.endswith("(no --master given and no CHANGE MASTER recorded)")


def test_restart_round_trip_through_the_file(tmp_path):
    """A CHANGE MASTER, saved, wins at the next start over the old command line; RESET SLAVE ALL undoes it."""
    f = MasterInfoFile(tmp_path)
    configured, _ = effective_master(CONFIG, f.load()[0])
    new = apply_change(configured, options("CHANGE MASTER TO MASTER_HOST='db2', MASTER_PORT=3307"),
                       flavour="mariadb", now=T0)
    f.save_choice(new)
    effective, reason = effective_master(CONFIG, MasterInfoFile(tmp_path).load()[0])
    assert (effective.host, effective.port, effective.user, effective.password) == ("db2", 3307, "repl", "cfg-pass")
    assert effective.gtid_mode == "mariadb" and reason.startswith("CHANGE MASTER at 2026-11-25T10:50:00Z to db2:3307")
    f.clear()
    effective, _ = effective_master(CONFIG, MasterInfoFile(tmp_path).load()[0])
    assert effective.host == "127.0.0.1"
