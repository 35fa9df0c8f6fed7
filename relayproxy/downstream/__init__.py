"""The replica side: the relay acting as a master to replicas and tools. The server (connections, auth), the
SQL it answers (sql/), the binlog dump sender (dump/), and what they share (context, semisync, users)."""
