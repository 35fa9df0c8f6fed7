"""The relay store's errors: what the store, its recovery and the readers of a relay directory raise."""

from __future__ import annotations

__all__ = [
    "RelayStoreError",
    "RelayRecoveryError",
    "RelayGapError",
    "RelayMismatchError",
    "RelayStateError",
    "RelayEventError",
    "RelayStoreFailed",
]


class RelayStoreError(Exception):
    """Base of every error the relay store raises."""


class RelayRecoveryError(RelayStoreError):
    """The relay directory cannot be opened without losing or serving bad data; nothing was changed
    in the damaged file. ``file`` and ``offset`` say where, when known."""

    def __init__(self, message: str, *, file: str | None = None, offset: int | None = None):
        self.file = file
        self.offset = offset
        super().__init__(message)


# ---------------------------------------------------------------------------------------------


class RelayGapError(RelayStoreError):
    """An event arrived beyond the end of the stored data: bytes in between were never received."""

    def __init__(self, offset: int, current_end: int, file: str | None = None):
        self.offset = offset
        self.current_end = current_end
        self.file = file
        super().__init__(
            f"gap in {file or 'the relay file'}: event at offset {offset}, but stored data ends at {current_end} "
            f"({offset - current_end} bytes missing)"
        )


class RelayMismatchError(RelayStoreError):
    """A re-sent event differs from the bytes the relay stored at that offset."""

    def __init__(self, offset: int, size: int, file: str | None, detail: str):
        self.offset = offset
        self.size = size
        self.file = file
        super().__init__(f"re-sent event at {file}:{offset} ({size} bytes) differs from the stored one: {detail}")


class RelayStateError(RelayStoreError):
    """A call that does not fit the store's state (no current file, open group at a file switch...)."""


class RelayEventError(RelayStoreError):
    """The bytes handed to write_event are not a well-formed event at that offset."""


class RelayStoreFailed(RelayStoreError):
    """An earlier file-system error left the store unusable: reopen it (recovery repairs the tail)."""
