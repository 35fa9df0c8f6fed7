"""relayproxy: a MySQL/MariaDB binlog relay that serves only complete, durable transactions."""

__version__ = "0.1.0"
