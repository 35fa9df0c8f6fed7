"""The `relayproxy` commands, one module each (run, serve, status, inspect, demo), the CLI that dispatches to
them and the configuration they share: wiring only, no protocol logic."""
