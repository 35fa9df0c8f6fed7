"""StoreReader: what readers may see of a relay's files, the one seam between the stores and those who read them.

Three stores implement it: ``RelayStore`` (relay/store.py, the relay's own directory, written by the upstream
session), ``ReadOnlyBinlogDir`` (relay/readonly.py, ``relayproxy serve`` over a directory it may not write) and
``FollowerStore`` (downstream/workers.py, a sender process's copy of what the relay process pushed). The dump
sender, the SQL layer, the catalog, the indexes, retention and status read a store only through these members,
each present on every store: a member a store has nothing for says so with its value (None, False, an empty
Epochs), never by being absent. mypy checks the three against it (``tests/project/test_types.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ..binlog.events import FormatDescription
    from .epochs import Epochs
    from .horizon import Horizon


@runtime_checkable
class StoreReader(Protocol):
    """A relay directory as readers see it. Every member is read at the time of asking (the files and the horizon
    move while the relay runs); nothing here writes, but ``purge_to`` (refused by a read-only store)."""

    @property
    def relay_dir(self) -> Path:
        """The directory the files are in."""

    @property
    def read_only(self) -> bool:
        """True when nothing may be written here (``relayproxy serve``; a sender process): PURGE is refused,
        no index sidecar is written, retention does not run."""

    @property
    def sidecars_writable(self) -> bool:
        """Whether file and transaction index sidecars (relay/fileindex.py, relay/txindex.py) may be written
        beside the files."""

    @property
    def horizon(self) -> Horizon:
        """The durable horizon: nothing past it is read, sent or reported."""

    @property
    def epochs(self) -> Epochs:
        """The upstream epochs (relay/epochs.py): one implicit epoch for a directory whose names are the
        master's own."""

    @property
    def current_file(self) -> str | None:
        """The file being written (the newest), None before any."""

    @property
    def flavour(self) -> str | None:
        """mysql or mariadb, from the files' FORMAT_DESCRIPTION; None before any."""

    @property
    def latest_format_description(self) -> FormatDescription | None:
        """The newest FORMAT_DESCRIPTION the files hold."""

    @property
    def transaction_index(self) -> object | None:
        """The store's own transaction index (a relay/txindex.py ``TransactionIndex``, which reads stores through
        this Protocol: typed ``object`` here so that neither module imports the other), None where the store keeps
        none."""

    def files(self) -> list[str]:
        """File names, oldest first."""

    def path(self, name: str) -> Path:
        """The path of one file (KeyError for a name the store does not hold, where the store can tell)."""

    def file_digest(self, name: str) -> str | None:
        """SHA-256 of a closed file's bytes when the store knows it without reading the file, else None."""

    def upstream_position(self) -> tuple[str | None, int] | None:
        """The durable horizon in the master's names ``(file, offset)``; None when the store cannot tell (no
        upstream: a served directory, a sender process)."""

    def purge_to(self, name: str) -> list[str]:
        """PURGE BINARY LOGS TO ``name``: the names removed. A read-only store refuses (RelayStoreError)."""
