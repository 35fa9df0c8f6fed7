"""The dump sender over a relay that followed a failover (two upstream epochs): a file/position replica crosses the
relay's ROTATE into the new epoch and gets every transaction once; fillers are never sent; the master's own
ROTATEs inside an epoch-2 file name the relay's files; a GTID replica continues by GTID. The storage side is
tests/relay/test_relay_epochs.py; the real-server story is tests/scenarios/test_scenario_failover.py."""

from __future__ import annotations

import struct
from types import SimpleNamespace

from relayproxy.binlog import constants as C
from relayproxy.binlog.gtid import GtidSet
from relayproxy.binlog.reader import scan_file
from relayproxy.relay import RelayStore

from ..support.fakemaster import make_event, next_binlog
from .test_downstream_dump import (
    CRC32,
    decode,
    dump_all,
    file_request,
    gtid_request,
    is_eof,
    make_conn,
    make_ctx,
    run,
)
from ..relay.test_relay_epochs import M2, RELAY_ID, T, U, m1_image, m1_phase, mysql_parts, new_relay, rebuild, stream
from ..upstream.test_receiver import master_events


def two_epochs(tmp_path, corpus_dir):
    """M1's binlog.000004 (dies after 12 of its groups), then M2's mysql-bin.000007 (U:20 last, so the GTID dump
    skips into a filler before M2's own ROTATE) and mysql-bin.000008: relay files binlog.000004/5/6."""
    from relayproxy.binlog.reader import scan_bytes

    p = mysql_parts(corpus_dir)
    store, receiver = new_relay(tmp_path / "relay")
    m1_phase(store, receiver, m1_image(p))
    m1_gtids = store.horizon.snapshot().gtids.copy()
    order = [*range(14), *range(15, 21), 14]
    first = rebuild(p.fde, [p.prev] + [ev for i in order for ev in p.groups[i]] + [make_event(
        C.ROTATE_EVENT, struct.pack("<Q", 4) + b"mysql-bin.000008", server_id=2, timestamp=T)])
    second = next_binlog(first, scan_bytes(p.image).gtids_after)
    store.begin_epoch(M2, "mysql-bin.000007", relay_server_id=RELAY_ID, now=T)
    files = [("mysql-bin.000007", first), ("mysql-bin.000008", second)]
    stream(receiver, master_events(files, gtids=store.horizon.snapshot().gtids, server_id=2), by_position=False)
    store.sync()
    store.close()
    return RelayStore.open(tmp_path / "relay"), m1_gtids



def test_a_file_position_replica_crosses_the_switch_and_never_gets_a_filler(tmp_path, corpus_dir):
    store, _ = two_epochs(tmp_path, corpus_dir)
    try:
        assert store.files() == ["binlog.000004", "binlog.000005", "binlog.000006"]
        # /status says which master each file came from (the documented extra beside SHOW BINARY LOGS).
        from relayproxy.ops.status import StatusSources, UpstreamSources, relay_status
        from relayproxy.upstream.receiver import ReceiverCounters, SemiSyncTally
        from relayproxy.upstream.session import UpstreamStatus

        upstream = UpstreamSources(status=UpstreamStatus(), receiver=SimpleNamespace(
            counters=ReceiverCounters(), master_position=None, master_timestamp=0, semi_sync=SemiSyncTally()))
        cfg = SimpleNamespace(master=("m2.example", 3307), gtid_mode="mysql", server_id=RELAY_ID,
                              relay_dir=store.relay_dir, sync_mode="transaction")
        epochs = relay_status(cfg, StatusSources(store, upstream))["epochs"]
        assert [(e["epoch"], e["first_file"], e["upstream_first_file"]) for e in epochs][-1] == (
            2, "binlog.000005", "mysql-bin.000007")
        assert epochs[-1]["master"]["server_id"] == 2 and epochs[-1]["join_gtids"] == f"{U}:1-16:20"  # M1 sent U:6-16 and U:20
        channel = run(dump_all(make_ctx(store), make_conn(**CRC32), file_request("binlog.000004", 4)))
        events, tail = decode(channel.payloads)
        assert is_eof(tail)
        assert not [e for e in events if e.type == C.IGNORABLE_LOG_EVENT]  # fillers stay on the relay
        # Every GTID of the relay's history exactly once, in the relay's order.
        gnos = [struct.unpack_from("<q", e.raw, C.HEADER_LEN + 17)[0] for e in events if e.type == C.GTID_LOG_EVENT]
        assert sorted(gnos) == list(range(6, 27)) and len(set(gnos)) == len(gnos)
        # Real ROTATEs (not artificial) name relay files only: the relay's at the switch, M2's renamed.
        rotates = [e for e in events if e.type == C.ROTATE_EVENT and not e.flags & C.LOG_EVENT_ARTIFICIAL_F]
        targets = [bytes(e.raw[C.HEADER_LEN + 8 : -4]).decode() for e in rotates]
        assert targets == ["binlog.000005", "binlog.000006"]
        # Past each filler the replica is repositioned by a fake ROTATE to (that file, the filler's end).
        fillers = []
        scan_file(store.path("binlog.000005"), on_event=lambda ev: fillers.append(ev)
                  if ev.type_code == C.IGNORABLE_LOG_EVENT else None)
        fake = [(bytes(e.raw[C.HEADER_LEN + 8 : -4]).decode(), struct.unpack_from("<Q", e.raw, C.HEADER_LEN)[0])
                for e in events if e.type == C.ROTATE_EVENT and e.flags & C.LOG_EVENT_ARTIFICIAL_F]
        for f in fillers:
            assert ("binlog.000005", f.offset + f.size) in fake
        # The replica's position arithmetic holds: each event after a reposition ends at its log_pos.
        assert events[-1].log_pos == store.path("binlog.000006").stat().st_size
    finally:
        store.close()


def test_a_gtid_replica_at_the_switch_point_gets_only_the_new_masters_transactions(tmp_path, corpus_dir):
    store, m1_gtids = two_epochs(tmp_path, corpus_dir)
    try:
        channel = run(dump_all(make_ctx(store, master_uuid=U), make_conn(**CRC32), gtid_request(m1_gtids)))
        events, tail = decode(channel.payloads)
        assert is_eof(tail)
        assert not [e for e in events if e.type == C.IGNORABLE_LOG_EVENT]
        gnos = [struct.unpack_from("<q", e.raw, C.HEADER_LEN + 17)[0] for e in events if e.type == C.GTID_LOG_EVENT]
        expected = GtidSet.parse(f"{U}:1-26").subtract(m1_gtids)
        assert sorted(gnos) == sorted(g for _sid, _tag, lo, hi in expected.intervals() for g in range(lo, hi + 1))
        assert len(set(gnos)) == len(gnos)
    finally:
        store.close()
