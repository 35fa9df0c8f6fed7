"""The relay store: relay files in master coordinates, their recovery, and the durable horizon readers wait on."""

from .horizon import Horizon, HorizonSnapshot
from .errors import (
    RelayEventError,
    RelayGapError,
    RelayMismatchError,
    RelayRecoveryError,
    RelayStateError,
    RelayStoreError,
    RelayStoreFailed,
)
from .recovery import RecoveryReport
from .store import RelayStore, SyncPolicy, SyncTicket

__all__ = [
    "Horizon",
    "HorizonSnapshot",
    "RecoveryReport",
    "RelayEventError",
    "RelayGapError",
    "RelayMismatchError",
    "RelayRecoveryError",
    "RelayStateError",
    "RelayStore",
    "RelayStoreError",
    "RelayStoreFailed",
    "SyncPolicy",
    "SyncTicket",
]
