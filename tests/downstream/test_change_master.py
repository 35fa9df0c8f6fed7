"""Tests for the replication admin statements (downstream/sql/replication_parser.py): STOP/START/RESET SLAVE|REPLICA and
CHANGE MASTER TO / CHANGE REPLICATION SOURCE TO, their errors (the servers' codes) and their secrecy."""

from __future__ import annotations


import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from relayproxy.downstream.sql import replication_parser as ra
from relayproxy.downstream.sql.replication_parser import (
    AdminStatementError,
    ChangeMaster,
    ResetReplica,
    StartReplica,
    StopReplica,
    check_flavour,
    parse_admin_statement,
    render_change_master,
)

SECRET = "Sup3r-s3cret"


def parse(sql: str, **kw):
    return parse_admin_statement(sql, **kw)


def error_of(sql: str, **kw) -> AdminStatementError:
    with pytest.raises(AdminStatementError) as info:
        parse(sql, **kw)
    return info.value


def near_text(err: AdminStatementError) -> str:
    assert err.code == 1064 and err.sqlstate == "42000"
    head = "You have an error in your SQL syntax; check the manual that corresponds to your "
    assert err.message.startswith(head)
    return err.message.split(" near '", 1)[1].rsplit("' at line ", 1)[0]


# ---------------------------------------------------------------------------------------------
# STOP / START / RESET


@pytest.mark.parametrize("sql, expected", [
    ("STOP SLAVE", StopReplica(True, True)),
    ("STOP REPLICA", StopReplica(True, True)),
    ("stop slave;", StopReplica(True, True)),
    ("  Stop\n\tReplica ;  ", StopReplica(True, True)),
    ("STOP SLAVE IO_THREAD", StopReplica(True, False)),
    ("STOP REPLICA SQL_THREAD", StopReplica(False, True)),
    ("STOP SLAVE IO_THREAD, SQL_THREAD", StopReplica(True, True)),
    ("STOP SLAVE RELAY_THREAD", StopReplica(True, False)),
    ("STOP SLAVE io_thread , io_thread", StopReplica(True, False)),
    ("STOP SLAVE ''", StopReplica(True, True)),
    ("STOP SLAVE '' SQL_THREAD", StopReplica(False, True)),
    ("STOP REPLICA FOR CHANNEL ''", StopReplica(True, True)),
    ("STOP ALL SLAVES", StopReplica(True, True)),
    ("STOP ALL REPLICAS IO_THREAD", StopReplica(True, False)),
    ("START SLAVE", StartReplica(True, True)),
    ("START REPLICA", StartReplica(True, True)),
    ("start replica io_thread;", StartReplica(True, False)),
    ("START SLAVE SQL_THREAD", StartReplica(False, True)),
    ("START SLAVE SQL_THREAD,IO_THREAD", StartReplica(True, True)),
    ("START ALL SLAVES", StartReplica(True, True)),
    ("/* failover */ START -- go\n REPLICA # now\n", StartReplica(True, True)),
    ("START /*!50000 SLAVE */", StartReplica(True, True)),
    ("RESET SLAVE", ResetReplica(all=False)),
    ("RESET REPLICA", ResetReplica(all=False)),
    ("RESET SLAVE ALL", ResetReplica(all=True)),
    ("reset replica all ;", ResetReplica(all=True)),
    ("RESET SLAVE '' ALL", ResetReplica(all=True)),
    ("RESET REPLICA ALL FOR CHANNEL ''", ResetReplica(all=True)),
])
def test_stop_start_reset_forms(sql, expected):
    assert parse(sql) == expected


@pytest.mark.parametrize("sql", [
    "START TRANSACTION", "START TRANSACTION READ ONLY", "STOP GROUP_REPLICATION", "START GROUP_REPLICATION",
    "RESET MASTER", "RESET BINARY LOGS AND GTIDS", "RESET QUERY CACHE", "SELECT 1", "SHOW SLAVE STATUS", "",
])
def test_other_statements_are_not_ours(sql):
    assert parse(sql) is None


@pytest.mark.parametrize("sql, name", [
    ("STOP SLAVE 'other'", "other"),
    ("START SLAVE \"m2\" IO_THREAD", "m2"),
    ("RESET SLAVE 'x' ALL", "x"),
])
def test_named_connection_is_mariadb_1617(sql, name):
    err = error_of(sql)
    assert (err.code, err.sqlstate, err.message) == (1617, "HY000", f"There is no master connection '{name}'")


@pytest.mark.parametrize("sql", ["STOP REPLICA FOR CHANNEL 'ch1'", "START SLAVE IO_THREAD FOR CHANNEL 'ch1'",
                                 "RESET REPLICA ALL FOR CHANNEL 'ch1'"])
def test_named_channel_is_mysql_3074(sql):
    err = error_of(sql)
    assert (err.code, err.sqlstate, err.message) == (3074, "HY000", "Replication channel 'ch1' does not exist.")


@pytest.mark.parametrize("sql, clause", [
    ("START SLAVE UNTIL MASTER_LOG_FILE='b.000002', MASTER_LOG_POS=4", "START SLAVE UNTIL"),
    ("START REPLICA SQL_THREAD UNTIL SQL_BEFORE_GTIDS='x:1'", "START REPLICA UNTIL"),
    ("START SLAVE UNTIL master_gtid_pos='0-1-5'", "START SLAVE UNTIL"),
])
def test_start_until_is_refused_by_name(sql, clause):
    err = error_of(sql)
    assert (err.code, err.sqlstate) == (1235, "42000")
    assert f"'{clause}'" in err.message


def test_start_with_connection_password_is_refused_without_showing_it():
    err = error_of(f"START REPLICA USER='repl' PASSWORD='{SECRET}'")
    assert (err.code, err.sqlstate) == (1235, "42000")
    assert "'START REPLICA ... USER'" in err.message
    assert SECRET not in err.message
    err = error_of(f"START REPLICA PASSWORD='{SECRET}'")
    assert "'START REPLICA ... PASSWORD'" in err.message and SECRET not in err.message


@pytest.mark.parametrize("sql, near", [
    ("STOP SLAVE IO_THREAD SQL_THREAD", "SQL_THREAD"),
    ("STOP SLAVE IO_THREAD,", ""),
    ("STOP SLAVE; START SLAVE", "START SLAVE"),
    ("STOP ALL", ""),
    ("RESET SLAVE ALL ALL", "ALL"),
    ("START REPLICA FOR CHANNEL", ""),
    ("STOP SLAVE `x`", "***"),
    ("STOP SLAVE 'a' 'b'", "'***'"),
])
def test_start_stop_syntax_errors(sql, near):
    assert near_text(error_of(sql)) == near


# ---------------------------------------------------------------------------------------------
# CHANGE MASTER TO: every option, both spellings

# (key, MASTER_ spelling, SOURCE_ spelling, value text, expected value)
OPTION_CASES = [
    ("host", "MASTER_HOST", "SOURCE_HOST", "'db2.example'", "db2.example"),
    ("port", "MASTER_PORT", "SOURCE_PORT", "3307", 3307),
    ("user", "MASTER_USER", "SOURCE_USER", "'repl'", "repl"),
    ("password", "MASTER_PASSWORD", "SOURCE_PASSWORD", f"'{SECRET}'", SECRET),
    ("ssl", "MASTER_SSL", "SOURCE_SSL", "1", True),
    ("ssl_ca", "MASTER_SSL_CA", "SOURCE_SSL_CA", "'/etc/ca.pem'", "/etc/ca.pem"),
    ("ssl_capath", "MASTER_SSL_CAPATH", "SOURCE_SSL_CAPATH", "'/etc/cas'", "/etc/cas"),
    ("ssl_cert", "MASTER_SSL_CERT", "SOURCE_SSL_CERT", "'/etc/c.pem'", "/etc/c.pem"),
    ("ssl_key", "MASTER_SSL_KEY", "SOURCE_SSL_KEY", "'/etc/k.pem'", "/etc/k.pem"),
    ("ssl_cipher", "MASTER_SSL_CIPHER", "SOURCE_SSL_CIPHER", "'ECDHE-RSA-AES128-GCM-SHA256'",
     "ECDHE-RSA-AES128-GCM-SHA256"),
    ("ssl_verify_server_cert", "MASTER_SSL_VERIFY_SERVER_CERT", "SOURCE_SSL_VERIFY_SERVER_CERT", "0", False),
    ("connect_retry", "MASTER_CONNECT_RETRY", "SOURCE_CONNECT_RETRY", "10", 10),
    ("heartbeat_period", "MASTER_HEARTBEAT_PERIOD", "SOURCE_HEARTBEAT_PERIOD", "2.5", 2.5),
    ("auto_position", "MASTER_AUTO_POSITION", "SOURCE_AUTO_POSITION", "1", True),
    ("log_file", "MASTER_LOG_FILE", "SOURCE_LOG_FILE", "'binlog.000042'", "binlog.000042"),
    ("log_pos", "MASTER_LOG_POS", "SOURCE_LOG_POS", "1234", 1234),
    ("public_key_path", "MASTER_PUBLIC_KEY_PATH", "SOURCE_PUBLIC_KEY_PATH", "'/etc/pub.pem'", "/etc/pub.pem"),
    ("get_public_key", "GET_MASTER_PUBLIC_KEY", "GET_SOURCE_PUBLIC_KEY", "1", True),
]


def test_option_table_covers_every_key():
    assert sorted([c[0] for c in OPTION_CASES] + ["use_gtid"]) == sorted(ra.OPTION_KEYS)


@pytest.mark.parametrize("key, master_kw, source_kw, text, value", OPTION_CASES, ids=[c[0] for c in OPTION_CASES])
@pytest.mark.parametrize("statement", ["CHANGE MASTER TO", "CHANGE REPLICATION SOURCE TO"])
def test_every_option_in_both_spellings_and_both_statements(statement, key, master_kw, source_kw, text, value):
    for keyword in (master_kw, source_kw, master_kw.lower(), source_kw.title()):
        cmd = parse(f"{statement} {keyword} = {text}")
        assert isinstance(cmd, ChangeMaster)
        assert cmd.options == {key: value}
        assert type(cmd.options[key]) is type(value)
        assert cmd.statement == statement[:-3]
        assert cmd.keywords == (keyword.upper(),)


@pytest.mark.parametrize("word, value", [("slave_pos", "slave_pos"), ("Current_Pos", "current_pos"), ("NO", "no")])
def test_master_use_gtid_bare_words(word, value):
    assert parse(f"CHANGE MASTER TO MASTER_USE_GTID = {word}").options == {"use_gtid": value}


def test_a_full_failover_statement():
    cmd = parse(
        "CHANGE MASTER TO\n  MASTER_HOST = 'db2',\n  MASTER_PORT = 3306, -- the new primary\n"
        f"  MASTER_USER = \"repl\", MASTER_PASSWORD = '{SECRET}', /* gtid */ MASTER_USE_GTID = slave_pos,\n"
        "  MASTER_CONNECT_RETRY = 5, MASTER_HEARTBEAT_PERIOD = 0.5, MASTER_SSL = 1 ;"
    )
    assert cmd.options == {"host": "db2", "port": 3306, "user": "repl", "password": SECRET, "use_gtid": "slave_pos",
                           "connect_retry": 5, "heartbeat_period": 0.5, "ssl": True}
    assert list(cmd.options) == ["host", "port", "user", "password", "use_gtid", "connect_retry",
                                 "heartbeat_period", "ssl"]


def test_mixing_master_and_source_spellings_is_accepted_as_mysql_does():
    cmd = parse("CHANGE REPLICATION SOURCE TO MASTER_HOST='a', SOURCE_PORT=1, MASTER_AUTO_POSITION=1")
    assert cmd.options == {"host": "a", "port": 1, "auto_position": True}
    assert cmd.keywords == ("MASTER_HOST", "SOURCE_PORT", "MASTER_AUTO_POSITION")


@pytest.mark.parametrize("text, value", [
    ("'it''s'", "it's"),
    ('"say ""hi"""', 'say "hi"'),
    (r"'a\'b'", "a'b"),
    (r"'back\\slash'", "back\\slash"),
    (r"'tab\there'", "tab\there"),
    (r"'nul\0'", "nul\0"),
    (r"'\%\_'", "\\%\\_"),
    (r"'\q'", "q"),
    ('"it\'s"', "it's"),
    ("''", ""),
    ("'h\u00e9te\u4e2d'", "h\u00e9te\u4e2d"),
])
def test_string_values_quotes_and_escapes(text, value):
    assert parse(f"CHANGE MASTER TO MASTER_USER = {text}").options == {"user": value}


@pytest.mark.parametrize("text, value", [("0x10", 16), ("0", 0), ("65535", 65535)])
def test_integer_values(text, value):
    assert parse(f"CHANGE MASTER TO MASTER_PORT={text}").options == {"port": value}


@pytest.mark.parametrize("text, value", [("0", 0.0), ("7", 7.0), ("1.25", 1.25), (".5", 0.5), ("3e2", 300.0),
                                         ("4294967", 4294967.0), ("0.0005", 0.0), ("0.001", 0.001)])
def test_heartbeat_values(text, value):
    assert parse(f"CHANGE MASTER TO MASTER_HEARTBEAT_PERIOD={text}").options == {"heartbeat_period": value}


@pytest.mark.parametrize("text, value", [("0", 4), ("3", 4), ("4", 4), ("18446744073709551615", 2 ** 64 - 1)])
def test_log_pos_below_the_header_is_raised_to_4_as_the_servers_do(text, value):
    assert parse(f"CHANGE MASTER TO MASTER_LOG_FILE='b.1', MASTER_LOG_POS={text}").options["log_pos"] == value


@pytest.mark.parametrize("text, value", [("0", False), ("1", True), ("2", True)])
def test_flag_values(text, value):
    assert parse(f"CHANGE MASTER TO MASTER_SSL={text}").options == {"ssl": value}


def test_executable_comments_are_read_as_sql():
    cmd = parse("CHANGE MASTER TO MASTER_HOST='h' /*!80023 , SOURCE_PORT=5 */ /*M!100500 */")
    assert cmd.options == {"host": "h", "port": 5}


# ---------------------------------------------------------------------------------------------
# CHANGE MASTER errors: the servers' codes, the option named


@pytest.mark.parametrize("sql, near", [
    # the value of an unknown option is not quoted: it may be a mistyped MASTER_PASSWORD
    ("CHANGE MASTER TO MASTER_HOSTT = 'db2', MASTER_PORT = 3306", "MASTER_HOSTT = '***', MASTER_PORT = 3306"),
    ("CHANGE MASTER TO MASTER_HOST='db2', MASTR_PORT=3306", "MASTR_PORT=***"),
    ("CHANGE MASTER TO SOURCE_HOSTNAME='x'", "SOURCE_HOSTNAME='***'"),
    ("CHANGE MASTER TO MASTER_USE_GTID='slave_pos'", "MASTER_USE_GTID='slave_pos'"),
    ("CHANGE MASTER TO MASTER_USE_GTID=maybe", "MASTER_USE_GTID=maybe"),
])
def test_unknown_option_or_value_is_1064_naming_it(sql, near):
    assert near_text(error_of(sql)) == near


@pytest.mark.parametrize("sql, keyword", [
    ("CHANGE MASTER TO MASTER_PORT = '3306'", "MASTER_PORT"),
    ("CHANGE MASTER TO MASTER_HOST = 5", "MASTER_HOST"),
    ("CHANGE MASTER TO MASTER_HOST = db2", "MASTER_HOST"),
    ("CHANGE MASTER TO MASTER_PORT = 3306.0", "MASTER_PORT"),
    ("CHANGE MASTER TO MASTER_CONNECT_RETRY = -1", "MASTER_CONNECT_RETRY"),
    ("CHANGE MASTER TO SOURCE_CONNECT_RETRY = 'ten'", "SOURCE_CONNECT_RETRY"),
    ("CHANGE MASTER TO MASTER_HEARTBEAT_PERIOD = 'x'", "MASTER_HEARTBEAT_PERIOD"),
    ("CHANGE MASTER TO MASTER_SSL = yes", "MASTER_SSL"),
    ("CHANGE MASTER TO MASTER_LOG_POS = -4", "MASTER_LOG_POS"),
    ("CHANGE MASTER TO MASTER_AUTO_POSITION = '1'", "MASTER_AUTO_POSITION"),
    ("CHANGE MASTER TO MASTER_HOST 'db2'", "MASTER_HOST"),
])
def test_wrong_value_type_is_1064_naming_the_option(sql, keyword):
    near = near_text(error_of(sql))
    assert near.startswith(keyword)


@pytest.mark.parametrize("sql, what", [
    ("CHANGE MASTER TO MASTER_PORT = 65536", "MASTER_PORT (65536 is not a TCP port: 0..65535)"),
    ("CHANGE MASTER TO SOURCE_PORT = 99999999", "SOURCE_PORT (99999999 is not a TCP port: 0..65535)"),
    ("CHANGE MASTER TO MASTER_CONNECT_RETRY = 4294967296", "MASTER_CONNECT_RETRY (4294967296 is over 4294967295)"),
    ("CHANGE MASTER TO MASTER_HOST = ''", "MASTER_HOST"),
    ("CHANGE MASTER TO SOURCE_HOST = '   '", "SOURCE_HOST"),
    ("CHANGE MASTER TO MASTER_USER = 'a\nb'", "MASTER_USER"),
])
def test_out_of_range_or_empty_is_1210(sql, what):
    err = error_of(sql)
    assert (err.code, err.sqlstate, err.message) == (1210, "HY000", f"Incorrect arguments to {what}")


@pytest.mark.parametrize("text", ["4294968", "-1", "-0.5", "1e10"])
@pytest.mark.parametrize("keyword", ["MASTER_HEARTBEAT_PERIOD", "SOURCE_HEARTBEAT_PERIOD"])
def test_heartbeat_out_of_range_is_1624(keyword, text):
    err = error_of(f"CHANGE MASTER TO {keyword} = {text}")
    assert (err.code, err.sqlstate) == (1624, "HY000")
    assert err.message == ("The requested value for the heartbeat period is either negative or exceeds the maximum "
                           f"allowed (4294967 seconds). ({keyword})")


@pytest.mark.parametrize("sql, keyword", [
    ("CHANGE MASTER TO MASTER_HOST='a', MASTER_HOST='b'", "MASTER_HOST"),
    ("CHANGE MASTER TO MASTER_HOST='a', SOURCE_HOST='b'", "SOURCE_HOST"),
    ("CHANGE MASTER TO MASTER_USE_GTID=no, MASTER_USE_GTID=slave_pos", "MASTER_USE_GTID"),
    (f"CHANGE MASTER TO MASTER_PASSWORD='{SECRET}', MASTER_PASSWORD='x'", "MASTER_PASSWORD"),
])
def test_option_given_twice_is_1225(sql, keyword):
    err = error_of(sql)
    assert (err.code, err.sqlstate, err.message) == (1225, "HY000", f"Option '{keyword}' used twice in statement")


@pytest.mark.parametrize("sql", [
    "CHANGE MASTER TO MASTER_AUTO_POSITION=1, MASTER_LOG_FILE='b.000001'",
    "CHANGE MASTER TO MASTER_LOG_POS=4, MASTER_AUTO_POSITION=1",
    "CHANGE REPLICATION SOURCE TO SOURCE_AUTO_POSITION=1, SOURCE_LOG_FILE='b.1', SOURCE_LOG_POS=100",
])
def test_auto_position_with_coordinates_is_1776(sql):
    err = error_of(sql)
    assert (err.code, err.sqlstate) == (1776, "HY000")
    assert err.message == ("Parameters MASTER_LOG_FILE, MASTER_LOG_POS, RELAY_LOG_FILE and RELAY_LOG_POS cannot be "
                           "set when MASTER_AUTO_POSITION is active.")


def test_auto_position_off_with_coordinates_is_fine():
    cmd = parse("CHANGE MASTER TO MASTER_AUTO_POSITION=0, MASTER_LOG_FILE='b.1', MASTER_LOG_POS=120")
    assert cmd.options == {"auto_position": False, "log_file": "b.1", "log_pos": 120}


@pytest.mark.parametrize("mode", ["slave_pos", "current_pos"])
def test_use_gtid_with_coordinates_is_refused_1210(mode):
    err = error_of(f"CHANGE MASTER TO MASTER_USE_GTID={mode}, MASTER_LOG_FILE='b.1', MASTER_LOG_POS=4")
    assert (err.code, err.sqlstate) == (1210, "HY000")
    assert err.message.startswith(f"Incorrect arguments to MASTER_USE_GTID={mode} with MASTER_LOG_FILE/MASTER_LOG_POS")


def test_use_gtid_no_with_coordinates_is_fine():
    assert parse("CHANGE MASTER TO MASTER_USE_GTID=no, MASTER_LOG_FILE='b.1', MASTER_LOG_POS=4").options == {
        "use_gtid": "no", "log_file": "b.1", "log_pos": 4}


def test_both_gtid_options_are_refused_1210():
    err = error_of("CHANGE MASTER TO MASTER_USE_GTID=no, MASTER_AUTO_POSITION=0")
    assert err.code == 1210 and "MASTER_USE_GTID and MASTER_AUTO_POSITION" in err.message


@pytest.mark.parametrize("keyword", ["MASTER_DELAY", "SOURCE_DELAY", "MASTER_BIND", "IGNORE_SERVER_IDS",
                                     "RELAY_LOG_FILE", "MASTER_SSL_CRL", "MASTER_TLS_VERSION", "DO_DOMAIN_IDS",
                                     "PRIVILEGE_CHECKS_USER", "GTID_ONLY", "MASTER_RETRY_COUNT"])
def test_known_but_unsupported_options_are_1235_by_name(keyword):
    err = error_of(f"CHANGE MASTER TO MASTER_HOST='h', {keyword} = 1")
    assert (err.code, err.sqlstate) == (1235, "42000")
    assert err.message.startswith(f"relayproxy does not support 'CHANGE MASTER TO {keyword}'")


def test_change_replication_filter_is_1235():
    err = error_of("CHANGE REPLICATION FILTER REPLICATE_DO_DB = (db1)")
    assert (err.code, err.message.split(":")[0]) == (1235, "relayproxy does not support 'CHANGE REPLICATION FILTER'")


@pytest.mark.parametrize("sql, what", [
    ("CHANGE MASTER 'm2' TO MASTER_HOST='h'", "CHANGE MASTER ... connection 'm2'"),
    ("CHANGE MASTER TO MASTER_HOST='h' FOR CHANNEL 'c'", "CHANGE MASTER ... channel 'c'"),
    ("CHANGE REPLICATION SOURCE TO SOURCE_HOST='h' FOR CHANNEL 'c'", "CHANGE REPLICATION SOURCE ... channel 'c'"),
])
def test_change_of_another_connection_is_1235(sql, what):
    err = error_of(sql)
    assert err.code == 1235 and f"'{what}'" in err.message


def test_default_connection_names_are_accepted():
    assert parse("CHANGE MASTER '' TO MASTER_HOST='h' FOR CHANNEL ''").options == {"host": "h"}


@pytest.mark.parametrize("sql, near", [
    ("CHANGE MASTER MASTER_HOST='h'", "MASTER_HOST='h'"),
    ("CHANGE MASTER TO", ""),
    ("CHANGE MASTER TO MASTER_HOST='h',", ""),
    ("CHANGE MASTER TO MASTER_HOST='h' MASTER_PORT=1", "MASTER_PORT=1"),
    ("CHANGE SLAVE TO MASTER_HOST='h'", "SLAVE TO MASTER_HOST='h'"),
    ("CHANGE REPLICATION TO SOURCE_HOST='h'", "TO SOURCE_HOST='h'"),
    ("CHANGE MASTER TO MASTER_HOST='h'; STOP SLAVE", "STOP SLAVE"),
    ("CHANGE MASTER TO MASTER_HOST='h' { MASTER_PORT=1", "{ MASTER_PORT=1"),
    ("CHANGE MASTER TO MASTER_HOST='h', 'x'='y'", "'***'='***'"),
])
def test_change_master_syntax_errors(sql, near):
    assert near_text(error_of(sql)) == near


def test_syntax_error_reports_the_line_and_the_product():
    err = error_of("CHANGE MASTER TO\n  MASTER_HOST='h',\n  MASTER_PROT=1", flavour="mariadb")
    assert err.message == ("You have an error in your SQL syntax; check the manual that corresponds to your MariaDB "
                           "server version for the right syntax to use near 'MASTER_PROT=***' at line 3")


def test_near_text_is_cut_at_80_characters():
    near = near_text(error_of("CHANGE MASTER TO MASTER_HOSTX='h', " + "MASTER_PORT=1, " * 20))
    assert len(near) == 80 and near.startswith("MASTER_HOSTX='***', MASTER_PORT=1,")


def test_statements_over_64k_are_refused():
    sql = "CHANGE MASTER TO MASTER_HOST='" + "h" * (64 * 1024) + "'"
    err = error_of(sql)
    assert (err.code, err.sqlstate) == (1105, "HY000")
    assert "more than 65536 bytes" in err.message
    # counted in bytes: 30000 three-byte characters are 90000 bytes
    assert error_of("CHANGE MASTER TO MASTER_HOST='" + "\u4e2d" * 30000 + "'").code == 1105


def test_more_than_max_options_are_refused(monkeypatch):
    monkeypatch.setattr(ra, "MAX_OPTIONS", 2)
    assert parse("CHANGE MASTER TO MASTER_HOST='h', MASTER_PORT=1").options == {"host": "h", "port": 1}
    err = error_of("CHANGE MASTER TO MASTER_HOST='h', MASTER_PORT=1, MASTER_USER='u'")
    assert (err.code, err.message) == (1105, "CHANGE MASTER names more than 2 options")


# ---------------------------------------------------------------------------------------------
# Secrecy: the password never shows


def test_repr_and_str_of_change_master_mask_the_password():
    cmd = parse(f"CHANGE MASTER TO MASTER_HOST='h', MASTER_PASSWORD='{SECRET}'")
    assert cmd.options["password"] == SECRET
    for text in (repr(cmd), str(cmd), f"{cmd}", repr([cmd])):
        assert SECRET not in text
        assert "'password': '***'" in text
    assert repr(cmd) == ("ChangeMaster(options={'host': 'h', 'password': '***'}, statement='CHANGE MASTER')")


@pytest.mark.parametrize("template", [
    "CHANGE MASTER TO MASTER_HOSTT='h', MASTER_PASSWORD='{p}'",
    "CHANGE MASTER TO MASTER_PASSWORD='{p}', MASTER_HOSTT='h'",
    "CHANGE MASTER TO MASTER_PASSWORD='{p}' MASTER_HOST='h'",
    "CHANGE MASTER TO MASTER_PASSWORD={p}",
    "CHANGE MASTER TO MASTER_PASSWORD = '{p}",
    "CHANGE MASTER TO MASTER_PASSWORD '{p}'",
    "CHANGE MASTER TO MASTER_PASWORD='{p}'",
    "CHANGE MASTER TO SOURCE_PASSWORD='{p}' FOR CHANNEL",
    "CHANGE MASTER TO MASTER_USER='u\\', MASTER_PASSWORD='{p}', MASTER_PORT=1",
    "CHANGE MASTER TO MASTER_USER='u\\', MASTER_PASSWORD={p} ,",
    "CHANGE MASTER TO MASTER_HOST='h', MASTER_PASSWORD='{p}', MASTER_PASSWORD='{p}'",
    "CHANGE MASTER TO MASTER_HOST='h' /* x */ MASTER_PASSWORD='{p}'",
    "CHANGE MASTER TO MASTER_PASSWORD='{p}', MASTER_DELAY=1",
    "CHANGE MASTER TO MASTER_PASSWORD='{p}', MASTER_AUTO_POSITION=1, MASTER_LOG_POS=5",
    "START SLAVE USER='u' PASSWORD='{p}'",
    "CHANGE MASTER TO MASTER_PASSWORD='{p}' {{",
])
def test_errors_never_show_the_password(template):
    err = error_of(template.format(p=SECRET))
    assert SECRET not in err.message and SECRET not in repr(err) and SECRET not in str(err)


def test_render_can_mask_the_password():
    cmd = ChangeMaster({"host": "h", "password": SECRET})
    masked = "CHANGE MASTER TO MASTER_HOST='h', MASTER_PASSWORD='***'"
    assert render_change_master(cmd, mask_password=True) == masked
    assert render_change_master(cmd) == f"CHANGE MASTER TO MASTER_HOST='h', MASTER_PASSWORD='{SECRET}'"


# ---------------------------------------------------------------------------------------------
# Flavour


def test_check_flavour_accepts_what_fits():
    check_flavour(parse("CHANGE MASTER TO MASTER_HOST='h', MASTER_USE_GTID=slave_pos"), "mariadb")
    check_flavour(parse("CHANGE MASTER TO MASTER_HOST='h', MASTER_AUTO_POSITION=1, GET_MASTER_PUBLIC_KEY=1"), "mysql")
    check_flavour(parse("CHANGE REPLICATION SOURCE TO SOURCE_HOST='h', SOURCE_AUTO_POSITION=1"), "mysql")
    check_flavour(StopReplica(), "mysql")
    check_flavour(ResetReplica(True), "mariadb")


@pytest.mark.parametrize("sql, flavour, near", [
    ("CHANGE MASTER TO MASTER_HOST='h', MASTER_USE_GTID=slave_pos", "mysql", "MASTER_USE_GTID=slave_pos"),
    ("CHANGE MASTER TO MASTER_AUTO_POSITION=1, MASTER_HOST='h'", "mariadb",
     "MASTER_AUTO_POSITION=1, MASTER_HOST='h'"),
    ("CHANGE MASTER TO MASTER_HOST='h', SOURCE_PORT=5", "mariadb", "SOURCE_PORT=5"),
    ("CHANGE MASTER TO MASTER_PUBLIC_KEY_PATH='/k'", "mariadb", "MASTER_PUBLIC_KEY_PATH='/k'"),
    ("CHANGE MASTER TO GET_MASTER_PUBLIC_KEY=1", "mariadb", "GET_MASTER_PUBLIC_KEY=1"),
    (f"CHANGE REPLICATION SOURCE TO SOURCE_HOST='h', SOURCE_PASSWORD='{SECRET}'", "mariadb",
     "REPLICATION SOURCE TO SOURCE_HOST='h', SOURCE_PASSWORD='***'"),
])
def test_check_flavour_refuses_the_other_flavours_options_with_1064(sql, flavour, near):
    with pytest.raises(AdminStatementError) as info:
        check_flavour(parse(sql), flavour)
    err = info.value
    assert near_text(err) == near
    product = "MariaDB" if flavour == "mariadb" else "MySQL"
    assert f"your {product} server version" in err.message
    assert SECRET not in err.message


def test_check_flavour_on_a_built_statement_uses_default_spellings():
    with pytest.raises(AdminStatementError) as info:
        check_flavour(ChangeMaster({"host": "h", "auto_position": True}), "mariadb")
    assert near_text(info.value) == "MASTER_AUTO_POSITION=1"
    with pytest.raises(ValueError):
        check_flavour(ChangeMaster({}), "postgres")


# ---------------------------------------------------------------------------------------------
# The builder for the servers' statements (promote, pitr, the lab and the benchmarks)


@pytest.mark.parametrize("flavour, version, gtid, text", [
    ("mariadb", (10, 11, 6), True, "CHANGE MASTER TO MASTER_HOST='h', MASTER_PORT=3307, MASTER_USE_GTID=slave_pos"),
    ("mariadb", (), False, "CHANGE MASTER TO MASTER_HOST='h', MASTER_PORT=3307, MASTER_USE_GTID=no"),
    ("mariadb", (), "current_pos", "CHANGE MASTER TO MASTER_HOST='h', MASTER_PORT=3307, MASTER_USE_GTID=current_pos"),
    ("mysql", (5, 7, 44), True, "CHANGE MASTER TO MASTER_HOST='h', MASTER_PORT=3307, MASTER_AUTO_POSITION=1"),
    ("mysql", (8, 0, 22), False, "CHANGE MASTER TO MASTER_HOST='h', MASTER_PORT=3307, MASTER_AUTO_POSITION=0"),
    ("mysql", (8, 0, 23), True,
     "CHANGE REPLICATION SOURCE TO SOURCE_HOST='h', SOURCE_PORT=3307, SOURCE_AUTO_POSITION=1"),
    ("mysql", (8, 4, 0), None, "CHANGE REPLICATION SOURCE TO SOURCE_HOST='h', SOURCE_PORT=3307"),
])
def test_for_server_speaks_each_flavour_and_version(flavour, version, gtid, text):
    cmd = ChangeMaster.for_server(flavour, version, host="h", port=3307, gtid=gtid)
    assert render_change_master(cmd) == text
    check_flavour(parse(text, flavour=flavour), flavour)  # what the relay answers in that flavour's place parses it


def test_for_server_quotes_what_it_is_given():
    password = "it's a \\ back'\\slash\\"
    text = render_change_master(ChangeMaster.for_server("mysql", (8, 0, 36), host="h", user="o'neil",
                                                        password=password, log_file="bin.0001", log_pos=4))
    assert text == ("CHANGE REPLICATION SOURCE TO SOURCE_HOST='h', SOURCE_USER='o\\'neil', "
                    "SOURCE_PASSWORD='it\\'s a \\\\ back\\'\\\\slash\\\\', "
                    "SOURCE_LOG_FILE='bin.0001', SOURCE_LOG_POS=4")
    parsed = parse(text)
    assert (parsed.options["user"], parsed.options["password"]) == ("o'neil", password)


def test_for_server_renders_what_only_the_servers_take():
    text = render_change_master(ChangeMaster.for_server("mariadb", connection="pitr", host="h", delay=0))
    assert text == "CHANGE MASTER 'pitr' TO MASTER_HOST='h', MASTER_DELAY=0"
    assert render_change_master(ChangeMaster.for_server("mysql", (8, 0, 36), delay=0, get_public_key=True)) == (
        "CHANGE REPLICATION SOURCE TO SOURCE_DELAY=0, GET_SOURCE_PUBLIC_KEY=1")


def test_for_server_refuses_what_the_flavour_lacks():
    with pytest.raises(ValueError, match="MariaDB's"):
        ChangeMaster.for_server("mysql", gtid="slave_pos")
    with pytest.raises(ValueError, match="unknown CHANGE MASTER option keys: hots"):
        ChangeMaster.for_server("mariadb", hots="h")
    with pytest.raises(AdminStatementError):
        ChangeMaster.for_server("mariadb", get_public_key=True)


# ---------------------------------------------------------------------------------------------
# Properties

_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"), max_size=30)
_VALUE_STRATEGIES = {
    "host": _text.filter(lambda s: s.strip()),
    "port": st.integers(0, 65535),
    "user": _text,
    "password": _text,
    "ssl": st.booleans(),
    "ssl_ca": _text,
    "ssl_capath": _text,
    "ssl_cert": _text,
    "ssl_key": _text,
    "ssl_cipher": _text,
    "ssl_verify_server_cert": st.booleans(),
    "connect_retry": st.integers(0, 2 ** 32 - 1),
    "heartbeat_period": st.one_of(st.just(0.0), st.floats(0.001, 4294967, allow_nan=False)),
    "use_gtid": st.sampled_from(["slave_pos", "current_pos", "no"]),
    "auto_position": st.booleans(),
    "log_file": _text,
    "log_pos": st.integers(4, 2 ** 64 - 1),
    "public_key_path": _text,
    "get_public_key": st.booleans(),
}


@st.composite
def change_masters(draw):
    keys = draw(st.lists(st.sampled_from(sorted(_VALUE_STRATEGIES)), unique=True, min_size=1))
    options = {k: draw(_VALUE_STRATEGIES[k]) for k in keys}
    if "use_gtid" in options and "auto_position" in options:
        del options["auto_position"]
    coordinates = "log_file" in options or "log_pos" in options
    if coordinates and options.get("auto_position"):
        options["auto_position"] = False
    if coordinates and options.get("use_gtid") in ("slave_pos", "current_pos"):
        options["use_gtid"] = "no"
    statement = draw(st.sampled_from(["CHANGE MASTER", "CHANGE REPLICATION SOURCE"]))
    return ChangeMaster(options, statement)


@settings(max_examples=300, deadline=None)
@given(change_masters())
def test_parse_of_render_is_the_statement(cmd):
    text = render_change_master(cmd)
    parsed = parse(text)
    assert parsed == cmd
    assert parsed.statement == cmd.statement
    assert render_change_master(parsed) == text


_ALPHABET = list("'\"`\\;,=-()/*#\n\t .0123456789_@!{}") + [
    "CHANGE ", "MASTER ", "REPLICATION ", "SOURCE ", " TO ", "MASTER_HOST", "SOURCE_PORT", "MASTER_PASSWORD",
    "MASTER_USE_GTID", "slave_pos", "STOP ", "START ", "RESET ", "SLAVE ", "REPLICA ", "ALL ", "IO_THREAD",
    "SQL_THREAD", "UNTIL ", "FOR CHANNEL ", "/*!", "*/", "-- ", "0x1F", "1e9", "MASTER_HEARTBEAT_PERIOD",
    "MASTER_LOG_POS", "MASTER_AUTO_POSITION", "\u4e2d", "\u00e9",
]


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.sampled_from(_ALPHABET), max_size=40).map("".join), st.text(max_size=40))
def test_garbage_raises_only_admin_errors(tokens, noise):
    for sql in (tokens, noise, tokens + noise, "CHANGE MASTER TO " + tokens, "START SLAVE " + noise):
        try:
            result = parse(sql)
        except AdminStatementError as err:
            assert isinstance(err.code, int) and len(err.sqlstate) == 5 and err.message
        else:
            assert result is None or isinstance(result, (StopReplica, StartReplica, ResetReplica, ChangeMaster))


@settings(max_examples=400, deadline=None)
@given(change_masters(), st.data())
def test_a_mutated_statement_never_shows_the_password(cmd, data):
    password = "Zq" + data.draw(st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=6, max_size=12)) + "Qz"
    cmd = ChangeMaster({**cmd.options, "password": password}, cmd.statement)
    text = render_change_master(cmd)
    at = data.draw(st.integers(0, len(text)))
    how = data.draw(st.sampled_from(["delete", "insert", "replace"]))
    char = data.draw(st.sampled_from(list("'\"\\,=;x {`") + ["-- ", "/*"]))
    if how == "delete":
        mutated = text[:at] + text[at + 1:]
    elif how == "insert":
        mutated = text[:at] + char + text[at:]
    else:
        mutated = text[:at] + char + text[at + 1:]
    try:
        result = parse(mutated)
    except AdminStatementError as err:
        assert password not in err.message
    else:
        if result is not None:
            assert password not in repr(result) and password not in str(result)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
@example("((")  # nesting past the bound: refused by the tokenizer itself (found by hypothesis)
def test_long_inputs_are_bounded_work(noise):
    """The work one statement may cost is bounded by its size, not by a clock (speed belongs in benchmarks):
    at most one token per character, and anything over the size limit is refused before it is read."""
    from relayproxy.downstream.sql.errors import SqlError
    from relayproxy.downstream.sql.parser import tokenize

    sql = "CHANGE MASTER TO MASTER_HOST='h', " + noise * 50
    try:
        assert len(tokenize(sql, strict=False)) <= len(sql) + 1
    except SqlError as refused:  # nesting past the bound (e.g. noise "((") is refused while tokenizing: bounded too
        assert "nested more than" in str(refused), refused
    try:
        parse(sql[: ra.MAX_STATEMENT_BYTES])
    except AdminStatementError as err:
        assert err.code and err.message, err  # refused with a code and words, never another exception
    with pytest.raises(AdminStatementError) as err:
        parse(sql + " " * (ra.MAX_STATEMENT_BYTES + 1 - len(sql)))
    assert err.value.code == 1105 and str(ra.MAX_STATEMENT_BYTES) in err.value.message
