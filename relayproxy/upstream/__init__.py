"""The master side: one asyncio connection to the master (connection), the sans-I/O IO thread that feeds the
store (receiver), and the session that connects, resumes from the horizon and reconnects (session)."""

from .connection import DEFAULT_MAX_BUFFERED, SSL_MODES, ConnectionLost, UpstreamConnection

__all__ = ["DEFAULT_MAX_BUFFERED", "SSL_MODES", "ConnectionLost", "UpstreamConnection"]
