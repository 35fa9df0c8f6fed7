"""What operators look at: the status document (`/status`, SHOW REPLICA STATUS, `relayproxy status`), Prometheus
metrics and the HTTP API that serves both."""
