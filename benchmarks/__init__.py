"""The benchmarks, a package: each module is a script anyone can rerun, and its results go to results/.

Run them from the repository root either way:

    .venv/bin/python benchmarks/fanout.py --quick       # as the README and every results file quote them
    .venv/bin/python -m benchmarks.fanout --quick       # the same, as a module

Modules import each other as ``benchmarks.<name>`` (and the relay's own tools from ``relayproxy.lab``: the relay
process, /proc readings, fuzzers). Run as a file, a script has its own folder on ``sys.path`` instead of the
repository root, so its first import is ``benchmarks/_bootstrap.py`` (only then: ``if not __package__``), which
puts the root there. The exceptions are parse_cost.py, spark_parse_cost.py and parsing.py (what both measure): Spark
ships spark_parse_cost.py and parsing.py (and benchinfo.py) to its executors as plain files (``addPyFile``), where
they import each other by their own names, so they keep their folder on ``sys.path`` themselves (common.py goes as
the ``benchmarks`` package).
"""
