"""FileCatalog: durable sizes, starting GTID sets and the purged set (incl. the MySQL 5.6.22 case)."""

from __future__ import annotations

from relayproxy.binlog import constants as C
from relayproxy.binlog.gtid import GtidSet, MariaBinlogState, MariaGtid
from relayproxy.relay.catalog import FileCatalog
from relayproxy.relay.store import RelayStore

from ..support import eventgen as E

SID = E.MYSQL_SID
OTHER = bytes(range(100, 116))


def mysql_file(start: GtidSet, gnos: list[int], next_name: str | None) -> bytes:
    events = [E.event(C.PREVIOUS_GTIDS_LOG_EVENT, start.encode())]
    for gno in gnos:
        events += [E.gtid(gno), E.query("BEGIN"), E.query("INSERT INTO t VALUES (1)"), E.xid(gno)]
    if next_name:
        events.append(E.rotate(next_name))
    return E.binlog_file(*events)


def relay_with(tmp_path, files: dict[str, bytes]) -> RelayStore:
    d = tmp_path / "relay"
    d.mkdir()
    for name, data in files.items():
        (d / name).write_bytes(data)
    (d / "relayproxy.index").write_text("".join(f"{n}\n" for n in files))
    return RelayStore.open(d)


def gtids(text: str) -> GtidSet:
    return GtidSet.parse(text)


def uuid_of(sid: bytes) -> str:
    import uuid

    return str(uuid.UUID(bytes=sid))


def test_sizes_and_starting_sets(tmp_path):
    first = mysql_file(GtidSet(), [1, 2, 3], "binlog.000002")
    start2 = GtidSet()
    start2.add_interval(SID, 1, 4)
    second = mysql_file(start2, [4, 5], None)
    store = relay_with(tmp_path, {"binlog.000001": first, "binlog.000002": second})
    catalog = FileCatalog(store)
    infos = catalog.files()
    assert [(i.name, i.size) for i in infos] == [("binlog.000001", len(first)), ("binlog.000002", len(second))]
    assert infos[0].start_gtids == GtidSet() and infos[1].start_gtids == start2
    assert catalog.purged() == GtidSet()  # nothing is missing
    store.close()


def test_purged_set_is_the_oldest_files_start(tmp_path):
    start1 = gtids(f"{uuid_of(SID)}:1-10")
    start2 = gtids(f"{uuid_of(SID)}:1-12")
    store = relay_with(tmp_path, {
        "binlog.000007": mysql_file(start1, [11, 12], "binlog.000008"),
        "binlog.000008": mysql_file(start2, [13], None),
    })
    assert FileCatalog(store).purged() == start1
    store.close()


def test_gtids_named_by_a_later_file_but_held_by_no_file_are_purged(tmp_path):
    """MySQL 5.6.22 (Bug #19012085): after SET GLOBAL gtid_purged the next file's PREVIOUS_GTIDS names
    transactions no file holds; the oldest file has an empty PREVIOUS_GTIDS and no GTID events."""
    restored = gtids(f"{uuid_of(OTHER)}:1-100")
    oldest = E.binlog_file(E.event(C.PREVIOUS_GTIDS_LOG_EVENT, GtidSet().encode()),
                           E.query("CREATE TABLE t (a INT)"), E.rotate("binlog.000002"))
    newer = mysql_file(restored, [1, 2], None)
    store = relay_with(tmp_path, {"binlog.000001": oldest, "binlog.000002": newer})
    purged = FileCatalog(store).purged()
    assert purged == restored
    store.close()


def test_mariadb_starting_state(tmp_path):
    state = MariaBinlogState([MariaGtid(0, 1, 5)])
    image = E.binlog_file(
        E.event(C.MARIA_GTID_LIST_EVENT, state.encode_gtid_list_body()),
        E.maria_gtid(6), E.query("BEGIN"), E.query("INSERT INTO t VALUES (1)"), E.xid(),
        server_version="10.11.6-MariaDB-log",
    )
    store = relay_with(tmp_path, {"mariadb-bin.000001": image})
    info = FileCatalog(store).files()[0]
    assert info.start_gtids == state and info.size == len(image)
    store.close()


def many_server_set(servers: int) -> GtidSet:
    """A GTID set naming ``servers`` server UUIDs (its PREVIOUS_GTIDS event is ~40 bytes a server)."""
    out = GtidSet()
    for i in range(servers):
        out.add_interval(i.to_bytes(4, "big") + bytes(12), 1, 10)
    return out


def test_a_starting_set_larger_than_the_first_head_read_is_read_whole(tmp_path, monkeypatch):
    """The head is read in 64 KiB first; a PREVIOUS_GTIDS event running past it (a set naming thousands of
    servers) is read whole, in both the oldest file (gtid_purged) and a later one."""
    from relayproxy.relay import catalog as catalog_module

    big = many_server_set(3000)
    assert len(big.encode()) > catalog_module._FIRST_HEAD_READ
    bigger = big.copy()
    bigger.add_interval(SID, 1, 3)
    store = relay_with(tmp_path, {
        "binlog.000001": mysql_file(big, [1, 2], "binlog.000002"),
        "binlog.000002": mysql_file(bigger, [3], None),
    })
    reads = []
    real = catalog_module.closed_files.read_head
    monkeypatch.setattr(catalog_module.closed_files, "read_head", lambda path, n: reads.append(n) or real(path, n))
    catalog = FileCatalog(store)
    infos = catalog.files()
    assert [i.start_gtids for i in infos] == [big, bigger]
    assert catalog.purged() == big
    assert reads == [catalog_module._FIRST_HEAD_READ, catalog_module._HEAD_READ] * 2
    store.close()


def test_a_small_starting_set_costs_one_small_read_a_file(tmp_path, monkeypatch):
    """The common case: FDE and PREVIOUS_GTIDS in the first bytes, one 64 KiB read a file, cached after."""
    from relayproxy.relay import catalog as catalog_module

    start2 = gtids(f"{uuid_of(SID)}:1-3")
    store = relay_with(tmp_path, {
        "binlog.000001": mysql_file(GtidSet(), [1, 2, 3], "binlog.000002"),
        "binlog.000002": mysql_file(start2, list(range(4, 3004)), None),  # larger than the first read
    })
    assert (store.relay_dir / "binlog.000002").stat().st_size > catalog_module._FIRST_HEAD_READ
    reads = []
    real = catalog_module.closed_files.read_head
    monkeypatch.setattr(catalog_module.closed_files, "read_head", lambda path, n: reads.append(n) or real(path, n))
    catalog = FileCatalog(store)
    assert [i.start_gtids for i in catalog.files()] == [GtidSet(), start2]
    assert catalog.purged() == GtidSet()
    catalog.files()
    assert reads == [catalog_module._FIRST_HEAD_READ] * 2
    store.close()
