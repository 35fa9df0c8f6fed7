"""The lab: private MariaDB servers, the fault-injecting proxy, the packet watcher, the failure stories and the
reference decoder. Tests, the demo and the benchmarks share it; the relay's runtime never imports it."""
