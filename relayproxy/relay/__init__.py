"""The relay store: relay files in master coordinates, their recovery, and the durable horizon readers wait on."""

from .horizon import Horizon, HorizonSnapshot
from .recovery import RecoveryReport, RelayRecoveryError, RelayStoreError
from .store import (
    RelayEventError,
    RelayGapError,
    RelayMismatchError,
    RelayStateError,
    RelayStore,
    RelayStoreFailed,
    SyncPolicy,
    SyncTicket,
)

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
