"""Relay file retention: the planner (a prefix, never the newest file, never a file a reader holds unless
forced), the retention_* options, purges on real relay stores (gtid_purged follows the oldest file), the SQL
PURGE sharing the reader check and needing an admin account, a dump whose file is purged under it, and
`relayproxy run` purging behind a real MariaDB master while a paused dump client holds a file."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import time
import uuid

import pymysql
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relayproxy.binlog import constants as C
from relayproxy.binlog.gtid import MariaBinlogState
from relayproxy.commands import config
from relayproxy.downstream import dump as D
from relayproxy.downstream.context import DumpProgress, ReplicaRegistration
from relayproxy.downstream.users import parse_users
from relayproxy.relay.catalog import FileCatalog
from relayproxy.relay.retention import (
    Reader,
    RelayFileState,
    RetentionPolicy,
    RetentionStats,
    RetentionTask,
    parse_duration,
    parse_file_count,
    parse_size,
    plan_purge,
    purge_with_policy,
    readers_of,
    relay_disk_usage,
)

from relayproxy.lab.harness import RelayProcess, free_port, prepare_master
from ..downstream.test_downstream_dump import (
    CRC32,
    OTHER,
    SID,
    FakeChannel,
    decode,
    error_of,
    expected_rotate,
    file_request,
    gtid_request,
    is_eof,
    make_conn,
    make_ctx,
    maria_request,
    mysql_file,
    relay_with,
    sid_set,
)
from ..downstream.test_downstream_sql import Relay

MARIA_CORPUS = "mariadb-operator-mariadb-poc/mariadb-binlog/binlogs/domain_id_0"
MARIA_NAMES = [f"mariadb-repl-bin.{n:06d}" for n in (4, 5, 6, 7)]  # consecutive: 0-10-262175 .. 0-10-262796
NOW = 1_800_000_000.0
SID_TEXT = str(uuid.UUID(bytes=SID))
OTHER_TEXT = str(uuid.UUID(bytes=OTHER))


def names(n: int) -> list[str]:
    return [f"binlog.{i:06d}" for i in range(1, n + 1)]


def states(sizes_ages: list[tuple[int, float]], now: float = NOW) -> list[RelayFileState]:
    return [RelayFileState(name, size, now - age) for name, (size, age) in zip(names(len(sizes_ages)), sizes_ages)]


# ---------------------------------------------------------------------------------------------
# The planner


def test_count_size_and_age_each_ask_for_a_prefix_with_their_reason():
    files = states([(100, 50), (100, 40), (100, 30), (100, 20), (100, 10)])
    by_count = plan_purge(files, [], RetentionPolicy(max_files=3), NOW)
    assert by_count.purge == ("binlog.000001", "binlog.000002") and by_count.keep_from == "binlog.000003"
    assert by_count.reasons == {"binlog.000001": ("count",), "binlog.000002": ("count",)}
    assert by_count.bytes_freed == 200 and not by_count.blocked
    by_size = plan_purge(files, [], RetentionPolicy(max_total_bytes=250), NOW)
    assert by_size.purge == ("binlog.000001", "binlog.000002", "binlog.000003")  # 200 bytes left
    assert by_size.reason_summary() == "size"
    by_age = plan_purge(files, [], RetentionPolicy(max_age=25), NOW)
    assert by_age.purge == ("binlog.000001", "binlog.000002", "binlog.000003")
    both = plan_purge(files, [], RetentionPolicy(max_age=45, max_files=4), NOW)
    assert both.reasons == {"binlog.000001": ("age", "count")}
    # Age goes on past what the other limits purge: the file after them is old too.
    assert plan_purge(files, [], RetentionPolicy(max_age=35, max_files=4), NOW).reasons == {
        "binlog.000001": ("age", "count"), "binlog.000002": ("age",)}
    assert plan_purge(files, [], RetentionPolicy(max_files=5, max_total_bytes=500, max_age=60), NOW).purge == ()


def test_age_stops_at_the_first_younger_file_and_the_newest_file_always_stays():
    # A younger file in the middle (its mtime was touched) stops the age limit: never a hole.
    files = states([(10, 90), (10, 5), (10, 90), (10, 90)])
    assert plan_purge(files, [], RetentionPolicy(max_age=60), NOW).purge == ("binlog.000001",)
    # ... unless another limit purges it anyway: then the old files after it go too.
    assert plan_purge(files, [], RetentionPolicy(max_age=60, max_files=2), NOW).purge == (
        "binlog.000001", "binlog.000002", "binlog.000003")
    old = states([(10, 90), (10, 90), (10, 90)])
    assert plan_purge(old, [], RetentionPolicy(max_age=1, max_total_bytes=1, max_files=1), NOW).purge == (
        "binlog.000001", "binlog.000002")
    assert plan_purge(old[:1], [], RetentionPolicy(max_files=1, max_age=1), NOW).purge == ()
    assert plan_purge([], [], RetentionPolicy(max_files=1), NOW).purge == ()
    # A protected file (the horizon's) and everything after it stay too.
    assert plan_purge(old, [], RetentionPolicy(max_files=1), NOW, protect=["binlog.000002"]).purge == ("binlog.000001",)


def test_a_reader_holds_its_file_and_every_later_one_unless_forced():
    files = states([(100, 50)] * 5)
    reader = Reader(21, "binlog.000002", 202)
    other = Reader(9, "binlog.000003")
    plan = plan_purge(files, [reader, other], RetentionPolicy(max_files=1), NOW)
    assert plan.purge == ("binlog.000001",)
    assert plan.wanted == ("binlog.000001", "binlog.000002", "binlog.000003", "binlog.000004")
    assert plan.deferred == ("binlog.000002", "binlog.000003", "binlog.000004")
    assert plan.held == {"binlog.000002": (reader,), "binlog.000003": (other,)}
    assert plan.held_summary() == (
        "binlog.000002 is read by connection 21 (replica server_id 202); binlog.000003 is read by connection 9"
    )
    assert plan.evicted == () and plan.blocked
    forced = plan_purge(files, [reader, other], RetentionPolicy(max_files=1, force=True), NOW)
    assert forced.purge == plan.wanted and forced.held == {} and forced.deferred == ()
    assert forced.evicted == (other, reader)  # by connection id
    # A reader of a file the policy does not want changes nothing.
    assert plan_purge(files, [Reader(3, "binlog.000005")], RetentionPolicy(max_files=1), NOW).purge == plan.wanted


@st.composite
def planner_inputs(draw):
    n = draw(st.integers(0, 8))
    files = [RelayFileState(name, draw(st.integers(0, 1000)), NOW - draw(st.floats(0, 100))) for name in names(n)]
    readers = [Reader(i, name) for i, name in enumerate(names(n)) if draw(st.booleans()) and draw(st.booleans())]
    policy = RetentionPolicy(
        max_age=draw(st.none() | st.floats(0.5, 120)),
        max_total_bytes=draw(st.none() | st.integers(1, 6000)),
        max_files=draw(st.none() | st.integers(1, 9)),
        force=draw(st.booleans()),
    )
    protect = draw(st.lists(st.sampled_from(names(n)), max_size=1)) if n else []
    return files, readers, policy, protect


@settings(max_examples=400, deadline=None)
@given(planner_inputs())
def test_planner_properties(inputs):
    files, readers, policy, protect = inputs
    plan = plan_purge(files, readers, policy, NOW, protect=protect)
    all_names = [f.name for f in files]
    k = len(plan.purge)
    assert list(plan.purge) == all_names[:k]  # a prefix, never a hole
    assert k < max(len(files), 1)  # the newest file stays
    if protect:
        assert protect[0] not in plan.purge
    assert plan.keep_from == (all_names[k] if k else None)
    assert plan.bytes_freed == sum(f.size for f in files[:k])
    held = {r.file for r in readers}
    if policy.force:
        assert plan.deferred == () and {r.file for r in plan.evicted} == held & set(plan.purge)
    else:
        assert not held & set(plan.purge) and plan.evicted == ()
    # Every purged file is there because a limit asked for it, and that limit really holds.
    for i, name in enumerate(plan.purge):
        assert plan.reasons[name]
        for reason in plan.reasons[name]:
            if reason == "count":
                assert len(files) - i > policy.max_files
            elif reason == "size":
                assert sum(f.size for f in files[i:]) > policy.max_total_bytes
            else:
                assert files[i].mtime < NOW - policy.max_age
    # When nothing blocks, the files that stay satisfy every limit (down to the one file that always stays),
    # and planning again over them purges nothing more.
    if not plan.deferred and not protect:
        kept = files[k:]
        assert plan_purge(kept, [], policy, NOW).purge == ()
        if len(kept) > 1:
            assert policy.max_files is None or len(kept) <= policy.max_files
            assert policy.max_total_bytes is None or sum(f.size for f in kept) <= policy.max_total_bytes
            assert policy.max_age is None or kept[0].mtime >= NOW - policy.max_age


# ---------------------------------------------------------------------------------------------
# Options


def test_durations_sizes_and_counts_parse_with_units():
    assert parse_duration("3600") == parse_duration(3600) == parse_duration("1h") == parse_duration("60m") == 3600
    assert parse_duration("7d") == 7 * 86400 and parse_duration("0.2") == 0.2 and parse_duration(" 2w ") == 14 * 86400
    assert parse_size("1048576") == parse_size("1M") == parse_size("1MiB") == parse_size("1mb") == 1 << 20
    assert parse_size("20G") == 20 << 30 and parse_size("1T") == 1 << 40 and parse_size("64k") == 65536
    assert parse_file_count("3") == parse_file_count(3) == 3
    for bad in ("", "7 days", "-1", "0", "1y", "h", True, float("inf")):
        with pytest.raises(ValueError, match="duration"):
            parse_duration(bad)
    for bad in ("", "20X", "0", "-5M", "1.5.5G", False):
        with pytest.raises(ValueError, match="size"):
            parse_size(bad)
    for bad in ("0", "-2", "two", 1.5, True):
        with pytest.raises(ValueError):
            parse_file_count(bad)


def load(**env: str) -> config.RelayConfig:
    return config.load(None, environ={f"RELAYPROXY_{k.upper()}": v for k, v in env.items()})


def test_retention_options_from_the_environment_and_toml(tmp_path):
    cfg = load(retention_max_age="12h", retention_max_bytes="500M", retention_max_files="10", retention_force="yes")
    policy = RetentionPolicy.from_config(cfg)
    assert policy == RetentionPolicy(max_age=43200, max_total_bytes=500 << 20, max_files=10, force=True)
    assert cfg.retention_interval == 60.0
    toml = tmp_path / "relay.toml"
    toml.write_text('retention-max-files = 3\nretention_interval = "500ms"\n')
    with pytest.raises(config.ConfigError) as err:
        config.load(None, environ={"RELAYPROXY_CONFIG": str(toml)})
    assert "retention_interval '500ms'" in str(err.value) and str(toml) in str(err.value)
    toml.write_text('retention-max-files = 3\nretention_interval = 0.5\n')
    cfg = config.load(None, environ={"RELAYPROXY_CONFIG": str(toml)})
    assert (cfg.retention_max_files, cfg.retention_interval) == (3, 0.5)
    assert not RetentionPolicy.from_config(load()).enabled


@pytest.mark.parametrize("option, value, fragment", [
    ("retention_max_age", "7 days", "duration"),
    ("retention_max_age", "0", "positive"),
    ("retention_max_bytes", "lots", "size"),
    ("retention_max_files", "0", "at least 1"),
    ("retention_interval", "-1", "duration"),
    ("retention_force", "maybe", "boolean"),
])
def test_bad_retention_values_name_the_option_and_the_source(option, value, fragment):
    with pytest.raises(config.ConfigError) as err:
        load(**{option: value})
    message = str(err.value)
    assert f"invalid {option} {value!r} from environment RELAYPROXY_{option.upper()}" in message
    assert fragment in message


def test_relayproxy_serve_refuses_retention_options(tmp_path):
    import argparse

    from relayproxy.commands import serve as S

    parser = argparse.ArgumentParser()
    S.add_arguments(parser)
    args = parser.parse_args(["--binlog-dir", str(tmp_path), "--listen", "127.0.0.1:0", "--users", "r:pw",
                              "--retention-max-files", "2"])
    with pytest.raises(config.ConfigError, match="read-only and never purges.*retention_max_files"):
        S.load(args, environ={})


def test_admin_accounts_in_users():
    users = parse_users("ops:secret:admin,repl:env:PW:required", environ={"PW": "x"})
    assert [(u.name, u.admin) for u in users] == [("ops", True), ("repl", False)]
    table = parse_users([{"name": "ops", "password": "hunter2", "admin": True}, {"name": "r", "password": "s"}])
    assert [u.admin for u in table] == [True, False]
    assert "admin=True" in repr(table[0]) and "hunter2" not in repr(table[0])
    with pytest.raises(ValueError, match=r"users\[0\] \('ops'\): admin must be true or false"):
        parse_users([{"name": "ops", "password": "s", "admin": "yes"}])


# ---------------------------------------------------------------------------------------------
# Purging real relay stores


def three_mysql_files() -> dict[str, bytes]:
    """Three MySQL files; the third's PREVIOUS_GTIDS names OTHER:1-3, in no earlier file's events (the
    5.6.22 case: gtid_purged merges it in)."""
    s1, s2 = sid_set(SID, 1, 2), sid_set(SID, 1, 4)
    s3 = sid_set(SID, 1, 6).union(sid_set(OTHER, 1, 3))
    return {
        "binlog.000001": mysql_file(s1, [3, 4], "binlog.000002"),
        "binlog.000002": mysql_file(s2, [5, 6], "binlog.000003"),
        "binlog.000003": mysql_file(s3, [7]),
    }


def set_ages(store, ages: dict[str, float], now: float) -> None:
    for name, age in ages.items():
        os.utime(store.path(name), (now - age, now - age))


def test_purge_by_count_size_and_age_on_a_store_and_gtid_purged_follows_the_oldest_file(tmp_path):
    files = three_mysql_files()
    store = relay_with(tmp_path, files)
    catalog = FileCatalog(store)
    stats = RetentionStats()
    s1 = sid_set(SID, 1, 2)
    assert catalog.purged() == s1.union(sid_set(OTHER, 1, 3))
    assert relay_disk_usage(store).bytes == sum(len(b) for b in files.values())
    now = time.time()
    set_ages(store, {"binlog.000001": 3600, "binlog.000002": 60, "binlog.000003": 3600}, now)
    # Age: only the first file is older than 10 minutes (the second stops it; the newest always stays).
    plan = purge_with_policy(store, {}, RetentionPolicy(max_age=600), stats, catalog=catalog, now=now)
    assert plan.purge == ("binlog.000001",) and store.files() == ["binlog.000002", "binlog.000003"]
    assert not (store.relay_dir / "binlog.000001").exists()
    assert (store.relay_dir / "relayproxy.index").read_text().split() == store.files()
    assert catalog.purged() == catalog.start_of("binlog.000002")[0].union(sid_set(OTHER, 1, 3))
    assert (stats.purges, stats.files_purged, stats.bytes_purged) == (1, 1, len(files["binlog.000001"]))
    # Size: the remaining two are larger than the limit, so the older goes.
    plan = purge_with_policy(store, {}, RetentionPolicy(max_total_bytes=len(files["binlog.000003"])), stats,
                             catalog=catalog, now=now)
    assert plan.purge == ("binlog.000002",) and plan.reasons == {"binlog.000002": ("size",)}
    assert store.files() == ["binlog.000003"]
    assert catalog.purged() == catalog.start_of("binlog.000003")[0] == sid_set(SID, 1, 6).union(sid_set(OTHER, 1, 3))
    # Count: the last file always stays.
    assert purge_with_policy(store, {}, RetentionPolicy(max_files=1), stats, now=now).purge == ()
    assert stats.as_dict()["runs"] == 3
    assert stats.bytes_purged == len(files["binlog.000001"]) + len(files["binlog.000002"])
    store.close()
    # The files are the state: a reopened store agrees.
    with relay_with(tmp_path / "again", {"binlog.000003": files["binlog.000003"]}) as again:
        assert FileCatalog(again).purged() == catalog.start_of("binlog.000003")[0]


def test_sql_gtid_purged_and_a_gtid_replica_see_the_purge(tmp_path):
    store = relay_with(tmp_path, three_mysql_files())
    relay = Relay(store, store.relay_dir, gtid_mode="mysql")
    assert relay.one("SELECT @@gtid_purged") == f"{SID_TEXT}:1-2,\n{OTHER_TEXT}:1-3"
    replica = sid_set(SID, 1, 3).union(sid_set(OTHER, 1, 3))
    first = asyncio.run(_dump(relay.ctx, gtid_request(replica)))
    assert is_eof(first[1]) and [e.view.gno for e in first[0] if e.type == C.GTID_LOG_EVENT][0] == 4
    plan = purge_with_policy(store, relay.ctx.connections, RetentionPolicy(max_files=2), RetentionStats(),
                             catalog=relay.ctx.catalog)
    assert plan.purge == ("binlog.000001",)
    # @@gtid_purged is the oldest file's PREVIOUS_GTIDS (+ the 5.6.22 merge), and a replica missing 4 is refused.
    assert relay.one("SELECT @@gtid_purged") == f"{SID_TEXT}:1-4,\n{OTHER_TEXT}:1-3"
    events, tail = asyncio.run(_dump(relay.ctx, gtid_request(replica)))
    code, message = error_of(tail)
    assert events == [] and code == 1236 and f"missing transactions are '{SID_TEXT}:4'" in message
    store.close()


def test_mariadb_purge_moves_the_oldest_gtid_list_and_old_positions_are_refused(tmp_path, corpus_dir):
    store = relay_with(tmp_path, {n: (corpus_dir / MARIA_CORPUS / n).read_bytes() for n in MARIA_NAMES})
    catalog = FileCatalog(store)
    assert catalog.purged() == MariaBinlogState.parse("0-10-262175")
    ctx = make_ctx(store)
    old_position = {"mariadb_slave_capability": 4, "slave_connect_state": "0-10-262600", **CRC32}
    events, tail = asyncio.run(_dump(ctx, maria_request(), conn=make_conn(**old_position)))
    assert is_eof(tail) and events
    plan = purge_with_policy(store, {}, RetentionPolicy(max_files=2), RetentionStats(), catalog=catalog)
    assert plan.purge == tuple(MARIA_NAMES[:2])
    # The GTID_LIST of the oldest remaining file is what the relay can no longer serve below.
    assert catalog.purged() == catalog.start_of(MARIA_NAMES[2])[0] == MariaBinlogState.parse("0-10-262667")
    events, tail = asyncio.run(_dump(make_ctx(store), maria_request(), conn=make_conn(**old_position)))
    code, message = error_of(tail)
    assert events == [] and code == 1236 and "required binlog files have been purged" in message
    store.close()


async def _dump(ctx, request, conn=None):
    channel = FakeChannel()
    await D.serve_dump(ctx, conn or make_conn(**CRC32), request, channel)
    return decode(channel.payloads)


# ---------------------------------------------------------------------------------------------
# SQL PURGE and the policy refuse the same readers; PURGE needs an admin account


def test_sql_purge_and_the_policy_name_the_same_reader(tmp_path):
    store = relay_with(tmp_path, three_mysql_files())
    relay = Relay(store, store.relay_dir, gtid_mode="mysql", users="repl:pw:admin,viewer:pw")
    reader = relay.connect(21)
    reader.dump = DumpProgress(file="binlog.000002", position=120)
    reader.registration = ReplicaRegistration(server_id=202)
    assert readers_of(relay.ctx.connections) == [Reader(21, "binlog.000002", 202)]
    err = relay.error("PURGE BINARY LOGS TO 'binlog.000003'", 1378)
    assert "binlog.000002 is being read by connection 21 (replica server_id 202)" in err.message
    plan = purge_with_policy(store, relay.ctx.connections, RetentionPolicy(max_files=1), RetentionStats())
    assert plan.purge == ("binlog.000001",) and plan.held_summary() == (
        "binlog.000002 is read by connection 21 (replica server_id 202)")
    # A non-admin account may not purge (after the target is checked, as a server checks it).
    viewer = relay.connect(30, user="viewer")
    denied = relay.error("PURGE BINARY LOGS TO 'binlog.000003'", 1227, conn=viewer)
    assert denied.sqlstate == "42000" and "SUPER or BINLOG_ADMIN" in denied.message and "admin = true" in denied.message
    relay.error("PURGE BINARY LOGS TO 'binlog.000009'", 1373, conn=viewer)
    relay.error("PURGE BINARY LOGS BEFORE '2999-01-01'", 1227, conn=viewer)
    reader.dump.file = "binlog.000003"
    relay.ok("PURGE BINARY LOGS TO 'binlog.000003'")
    assert store.files() == ["binlog.000003"]
    store.close()


def test_a_relay_without_accounts_refuses_purge(tmp_path, corpus_dir):
    store = relay_with(tmp_path, {n: (corpus_dir / MARIA_CORPUS / n).read_bytes() for n in MARIA_NAMES})
    relay = Relay(store, store.relay_dir)  # the files are MariaDB's: so is the relay
    err = relay.error(f"PURGE BINARY LOGS TO '{MARIA_NAMES[1]}'", 1227)
    assert "BINLOG ADMIN privilege" in err.message
    assert store.files() == MARIA_NAMES
    store.close()


# ---------------------------------------------------------------------------------------------
# A dump whose file is purged under it (retention_force)


class GatedChannel(FakeChannel):
    """A replica that stops reading after ``block_after`` payloads until ``release()``."""

    def __init__(self, block_after: int):
        super().__init__()
        self.block_after = block_after
        self.gate = asyncio.Event()
        self.blocked = asyncio.Event()

    async def send(self, payload) -> None:
        if len(self.payloads) >= self.block_after and not self.gate.is_set():
            self.blocked.set()
            await self.gate.wait()
        await super().send(payload)


def test_a_forced_purge_ends_the_dump_reading_the_file_with_1236(tmp_path):
    store = relay_with(tmp_path, three_mysql_files())

    async def scenario():
        ctx = make_ctx(store)
        conn = make_conn(**CRC32)
        ctx.connections[conn.conn_id] = conn
        channel = GatedChannel(block_after=4)  # rotate, FDE, PREVIOUS_GTIDS, GTID: then it stops reading
        task = asyncio.create_task(D.serve_dump(ctx, conn, file_request("binlog.000001", 4, flags=0), channel))
        await asyncio.wait_for(channel.blocked.wait(), 5)
        assert conn.dump.file == "binlog.000001"
        stats = RetentionStats()
        kept = purge_with_policy(store, ctx.connections, RetentionPolicy(max_files=1), stats)
        assert kept.purge == () and set(kept.held) == {"binlog.000001"} and stats.blocked_by_readers == 1
        forced = purge_with_policy(store, ctx.connections, RetentionPolicy(max_files=1, force=True), stats)
        assert forced.purge == ("binlog.000001", "binlog.000002") and forced.evicted == (Reader(7, "binlog.000001"),)
        assert store.files() == ["binlog.000003"] and stats.readers_evicted == 1
        channel.gate.set()
        await asyncio.wait_for(task, 5)
        return decode(channel.payloads)

    events, tail = asyncio.run(scenario())
    code, message = error_of(tail)
    assert code == 1236
    assert message.startswith("Could not open log file: binlog.000001 was purged from the relay while this replica")
    assert "the last event read from 'binlog.000001'" in message
    # Nothing of the next file went out: the dump stopped in the purged one.
    assert expected_rotate("binlog.000002", 4) not in [e.raw for e in events]
    store.close()


def test_the_retention_task_checks_on_an_interval_and_never_purges_a_read_only_store(tmp_path):
    store = relay_with(tmp_path, three_mysql_files())

    async def scenario():
        task = RetentionTask(RetentionPolicy(max_files=2), 0.05, lambda: store)
        runner = asyncio.create_task(task.run())
        while task.stats.files_purged < 1:
            await asyncio.sleep(0.01)
        runner.cancel()
        await asyncio.wait({runner})
        return task.stats

    stats = asyncio.run(scenario())
    assert store.files() == ["binlog.000002", "binlog.000003"] and stats.purges == 1 and stats.last_error is None

    class ReadOnly:
        read_only = True

        def files(self):
            raise AssertionError("a read-only store is never even listed")

    assert asyncio.run(RetentionTask(RetentionPolicy(max_files=1), 1, lambda: ReadOnly()).check()) is None
    with pytest.raises(ValueError, match="interval"):
        RetentionTask(RetentionPolicy(max_files=1), 0, lambda: store)
    store.close()


# ---------------------------------------------------------------------------------------------
# End to end: relayproxy run behind a real MariaDB master, a paused dump client holding a file


class RawDumpClient:
    """A COM_BINLOG_DUMP client that reads only when told: with a tiny receive buffer, the relay's dump
    sender blocks in the file it is sending as soon as the client stops reading."""

    def __init__(self, port: int, file: str, server_id: int = 77):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        self.conn = pymysql.connect(host="127.0.0.1", port=port, user="repl", password="replpw", defer_connect=True,
                                    read_timeout=20)
        self.conn.connect(sock)
        cur = self.conn.cursor()
        cur.execute("SET @master_binlog_checksum = 'CRC32'")
        cur.execute("SET @mariadb_slave_capability = 4")
        self.conn._execute_command(0x12, struct.pack("<IHI", 4, 0, server_id) + file.encode())

    def event(self) -> bytes:
        """The next event (pymysql raises OperationalError(code, message) on an ERR packet)."""
        packet = self.conn._read_packet()
        return packet.get_all_data()[1:]

    def close(self) -> None:
        self.conn.close()


def relay_index(relay: RelayProcess) -> list[str]:
    return (relay.relay_dir / "relayproxy.index").read_text().split()


def wait_until(predicate, what: str, relay: RelayProcess, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}\n{relay.log_tail()}")


def log_lines(relay: RelayProcess, event: str) -> list[dict]:
    out = []
    for line in relay.log_path.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") == event:
            out.append(entry)
    return out


@pytest.mark.server
@pytest.mark.parametrize("force", [False, True], ids=["held", "forced"])
def test_run_purges_by_count_behind_a_real_master_and_respects_a_paused_reader(mariadb, tmp_path, force):
    master = mariadb("master")
    prepare_master(master)
    master.execute("CREATE DATABASE app")
    master.execute("CREATE TABLE app.t (id INT AUTO_INCREMENT PRIMARY KEY, b LONGBLOB)")
    master.execute("FLUSH BINARY LOGS")
    conn = master.connect()
    try:  # the second file: 16 MB of row events, far more than the socket buffers hold
        cur = conn.cursor()
        cur.execute("SET SESSION binlog_format = 'ROW'")
        for _ in range(16):
            cur.execute("INSERT INTO app.t (b) VALUES (REPEAT('x', 1024 * 1024))")
            conn.commit()
    finally:
        conn.close()
    master.execute("FLUSH BINARY LOGS")
    master.execute("INSERT INTO app.t (b) VALUES ('third')")
    first, second, third = [p.name for p in master.binlog_files()][-3:]  # the second holds the 16 MB
    listen = free_port()
    relay = RelayProcess(
        tmp_path / "relay", master.port,
        extra=["--listen", f"127.0.0.1:{listen}", "--users", "repl:replpw:mysql_native_password",
               "--retention-max-files", "3", "--retention-interval", "0.2", "--retention-force", str(force).lower()],
    )
    relay.start()
    client = None
    try:
        relay.wait_caught_up(master)
        wait_until(lambda: relay_index(relay) == [first, second, third], "three relay files", relay)
        client = RawDumpClient(listen, second)
        assert client.event()[4] == C.ROTATE_EVENT and client.event()[4] == C.FORMAT_DESCRIPTION_EVENT
        # The client reads no more: the dump sender stays in the second file. Three rotations later the
        # policy wants the first three files gone.
        for i in range(3):
            master.execute(f"INSERT INTO app.t (b) VALUES ('more {i}')")
            master.execute("FLUSH BINARY LOGS")
        relay.wait_caught_up(master)
        newest = [p.name for p in master.binlog_files()][-3:]
        if not force:
            wait_until(lambda: first not in relay_index(relay), "the first file to be purged", relay)
            kept = wait_until(lambda: log_lines(relay, "relay files kept: a replica still reads them"),
                              "the retention task to report the held file", relay)
            assert second in kept[-1]["held"] and kept[-1]["kept"][0] == second
            assert relay_index(relay) == [second, third, *newest] and (relay.relay_dir / second).exists()
            # The client reads on, the whole held file, unharmed, and follows the rotation.
            while True:
                event = client.event()
                if event[4] == C.ROTATE_EVENT and event[19 + 8 : -4] == third.encode():
                    break
            client.close()
            client = None
            wait_until(lambda: relay_index(relay) == newest, "the held files to go once the reader left", relay)
        else:
            wait_until(lambda: relay_index(relay) == newest, "a forced purge of the files in use", relay)
            assert not (relay.relay_dir / second).exists()
            # The index is rewritten before the purge is logged: wait for the line rather than race it.
            purges = wait_until(lambda: log_lines(relay, "relay files purged by retention"),
                                "the forced purge to be logged", relay)
            assert any(second in p["files"] for p in purges) and purges[-1]["gtid_purged"] is not None
            # The paused client reads on: what was already sent, then a clean 1236 naming the purged file.
            with pytest.raises(pymysql.err.OperationalError) as err:
                for _ in range(100_000):
                    client.event()
            code, message = err.value.args
            assert code == 1236 and f"{second} was purged from the relay" in message
        # gtid_purged moved with the oldest file: a replica asking for a position in a purged file is refused.
        probe = RawDumpClient(listen, first, server_id=78)
        with pytest.raises(pymysql.err.OperationalError) as err:
            probe.event()
        assert err.value.args[0] == 1236 and "Could not find first log file name" in err.value.args[1]
        probe.close()
    finally:
        if client is not None:
            client.close()
        relay.stop()


def test_a_rotation_triggers_a_check_long_before_the_interval(monkeypatch):
    """A new file is when a limit is crossed: the task looks for rotations between its (long) interval checks."""
    from relayproxy.relay import retention

    monkeypatch.setattr(retention, "ROTATION_POLL", 0.01)

    class Rotating:
        current_file = "binlog.000001"

    store = Rotating()
    task = RetentionTask(RetentionPolicy(max_files=2), 3600, lambda: store)
    seen: list[str] = []

    async def check():
        seen.append(store.current_file)

    task.check = check

    async def scenario():
        runner = asyncio.create_task(task.run())
        while not seen:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)
        assert seen == ["binlog.000001"]  # no rotation, an hour to the next interval: no check
        store.current_file = "binlog.000002"
        while len(seen) < 2:
            await asyncio.sleep(0.005)
        runner.cancel()
        await asyncio.wait({runner})

    asyncio.run(asyncio.wait_for(scenario(), 30))
    assert seen == ["binlog.000001", "binlog.000002"]
