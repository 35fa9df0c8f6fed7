"""TLS over memory buffers (ssl.MemoryBIO), for both the master connection and the replicas' connections.

Why not loop.start_tls: uvloop's TLS transport drops data it has received but not yet handed to a paused
protocol when the peer closes the connection (MagicStack/uvloop PR #661, open), so a non-blocking dump's last
events and its EOF vanished whenever flow control had paused reading. Here every byte that arrives is decrypted
at once whatever the pause state, flow control pauses the plain TCP transport, and asyncio and uvloop behave
the same.
"""

from __future__ import annotations

import contextlib
import ssl
from typing import Any, Callable


class MemoryTls:
    """Ciphertext in, plaintext out, and back; one side of one connection."""

    _READ_SIZE = 256 * 1024

    def __init__(self, context: ssl.SSLContext, *, server_side: bool, server_hostname: str | None = None) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(
            self._incoming, self._outgoing, server_side=server_side, server_hostname=None if server_side else server_hostname
        )
        self.handshake_complete = False

    @property
    def version(self) -> str | None:
        return self._ssl.version()

    def start(self) -> bytes:
        """Client side: the ClientHello to send."""
        self._handshake()
        return self._outgoing.read()

    def _handshake(self) -> None:
        try:
            self._ssl.do_handshake()
        except ssl.SSLWantReadError:
            return
        self.handshake_complete = True

    def receive(self, data: bytes) -> bytes:
        """Take ciphertext from the peer; return the plaintext it completes (b"" while the handshake runs).
        Raises ssl.SSLError (certificate verification, bad record MAC, ...)."""
        self._incoming.write(data)
        if not self.handshake_complete:
            self._handshake()
            if not self.handshake_complete:
                return b""
        chunks = []
        while True:
            try:
                chunk = self._ssl.read(self._READ_SIZE)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                break  # close_notify: the peer is done; the TCP close follows
            if not chunk:
                break
            chunks.append(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def exchange(self, data: bytes, write: Callable[[bytes], object], handshake: Any = None) -> bytes:
        """One arrival of ciphertext on a connection: ``receive`` it, ``write`` what the TLS layer now owes the
        peer (handshake messages, post-handshake replies), and resolve ``handshake`` (a future, or None) once the
        handshake is complete. Returns the plaintext; raises ssl.SSLError with nothing written: what a TLS error
        means is the caller's (a replica's session and the master connection answer it differently)."""
        plaintext = self.receive(data)
        output = self._outgoing.read()
        if output:
            write(output)
        if self.handshake_complete and handshake is not None and not handshake.done():
            handshake.set_result(None)
        return plaintext

    def encrypt(self, data: bytes | bytearray | memoryview) -> bytes:
        self._ssl.write(data)
        return self._outgoing.read()

    def close_notify(self) -> bytes:
        # unwrap() then waits for the peer's close_notify, which we do not need.
        with contextlib.suppress(ssl.SSLError):
            self._ssl.unwrap()
        return self._outgoing.read()
