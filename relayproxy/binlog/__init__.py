"""Binlog codec, GTID arithmetic and the transaction-boundary parser (sans-I/O)."""
