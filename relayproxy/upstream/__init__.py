"""Upstream side of the relay: everything that talks to the master."""

from .connection import DEFAULT_MAX_BUFFERED, SSL_MODES, ConnectionLost, UpstreamConnection

__all__ = ["DEFAULT_MAX_BUFFERED", "SSL_MODES", "ConnectionLost", "UpstreamConnection"]
