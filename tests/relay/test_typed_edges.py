"""Edges the type check of relay/ brought to light: each now fails with the module's own error, naming what is
wrong, instead of an AttributeError or a format error from deep inside."""

from __future__ import annotations

import pytest

from relayproxy.relay.catalog import CatalogError, FileCatalog
from relayproxy.relay.epochs import Epoch, Epochs, EpochsError
from relayproxy.relay.horizon import Horizon

from .test_relay_store import maria_image, mysql_image


class _TwoFiles:
    """The read side of a store over two files written by hand (no store would list them together)."""

    read_only = True
    sidecars_writable = False
    transaction_index = None

    def __init__(self, relay_dir, names: list[str], newest_size: int):
        self.relay_dir = relay_dir
        self._names = names
        self.horizon = Horizon(names[-1], newest_size, None)
        self.epochs = Epochs()
        self.current_file = names[-1]

    def files(self) -> list[str]:
        return list(self._names)

    def path(self, name: str):
        return self.relay_dir / name


def test_gtid_purged_over_files_of_two_flavours_is_a_catalog_error(tmp_path):
    older, newer = maria_image("binlog.000002"), mysql_image(rotate=False)
    (tmp_path / "binlog.000001").write_bytes(older)
    (tmp_path / "binlog.000002").write_bytes(newer)
    catalog = FileCatalog(_TwoFiles(tmp_path, ["binlog.000001", "binlog.000002"], len(newer)))
    with pytest.raises(CatalogError, match="binlog.000001 and binlog.000002 hold GTID sets of different flavours"):
        catalog.purged()


def test_a_new_epoch_over_a_basename_recorded_without_its_width_is_refused_by_name():
    first = Epoch(1, "mysql-bin.000001", "mysql-bin.000001", None, None, None, None)
    epochs = Epochs((first,), "mysql-bin", None)  # a hand-edited file: the relay writes both or neither
    with pytest.raises(EpochsError, match="relay_basename 'mysql-bin' without relay_width"):
        epochs.next_epoch(index=["mysql-bin.000001"], current_empty=False,
                          master={"host": "m2", "port": 3306, "server_id": 2, "server_uuid": None},
                          upstream_first_file="mysql-bin.000002", join_gtids=None, started=1.0, relay_server_id=9)
