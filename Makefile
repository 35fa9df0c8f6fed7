# relayproxy: `make demo` and `make test` each do all the set-up they need first (`make setup`), on a fresh
# Debian machine as on a developer's: system packages via apt (only when missing), then .venv.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.relayproxy-installed

# Tests read the real binlog corpus from the shared folder beside the repository.
RELAYPROXY_CORPUS ?= $(abspath $(CURDIR)/../shared/corpus/binlogs)
export RELAYPROXY_CORPUS

PYTEST_ARGS ?=
DEMO_ARGS ?=

# Prints the first python >= 3.11 on PATH (nothing if there is none).
FIND_PYTHON := for p in python3.13 python3.12 python3.11 python3; do \
	  if command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; \
	  then command -v $$p; break; fi; \
	done

.PHONY: help setup system-packages python-env demo test test-quick lint clean bench

help:
	@echo "make demo    set up, then run relayproxy demo: master, relay, replicas; a master crash mid-transaction"
	@echo "make test    set up, then run every test (unit, corpus and real-server tests) with pytest"
	@echo "make test-quick  the edit loop: unit, property and corpus tests only (no server, Spark, docker, MHA or slow test)"
	@echo "make setup   install mariadb-server, mariadb-backup, python3-venv, a JRE, docker-compose and MHA (+ openssh-server) with apt if missing, create .venv, install relayproxy"
	@echo "make lint    byte-compile everything; ruff too if it is installed in .venv"
	@echo "make bench   re-run every benchmark on this checkout and rewrite benchmarks/results/ (takes long; not part of make test)"
	@echo "make clean   remove caches and build output (keeps .venv)"

setup: python-env

# Installs with apt only what is missing: mariadb-server when there is no mariadbd, mariadb-backup (the PITR tests
# restore real backups), python3 / python3-venv
# when there is no python >= 3.11 able to create a venv, a Java runtime for PySpark when there is no java,
# docker-compose (Debian's v1, without the Docker engine
# it recommends: tests/project/test_docker.py only validates the compose files) when there is no docker-compose, and
# MHA 0.58 (mha4mysql-manager, mha4mysql-node) with openssh-server for tests/scenarios/test_mha.py, which runs MHA for real
# over its own private sshd on a free port (on a machine with systemd, apt also starts the package's own sshd).
# Root runs apt directly, others through sudo.
system-packages:
	@missing=""; \
	if ! command -v mariadbd >/dev/null 2>&1 && [ ! -x /usr/sbin/mariadbd ]; then missing=" mariadb-server"; fi; \
	if ! command -v mariadb-backup >/dev/null 2>&1; then missing="$$missing mariadb-backup"; fi; \
	py=$$($(FIND_PYTHON)); \
	if [ -z "$$py" ]; then missing="$$missing python3 python3-venv"; \
	elif ! "$$py" -c 'import ensurepip, venv' >/dev/null 2>&1; then missing="$$missing python3-venv"; fi; \
	if ! command -v java >/dev/null 2>&1; then missing="$$missing default-jre-headless"; fi; \
	if ! command -v masterha_check_repl >/dev/null 2>&1; then missing="$$missing mha4mysql-manager"; fi; \
	if ! command -v apply_diff_relay_logs >/dev/null 2>&1; then missing="$$missing mha4mysql-node"; fi; \
	if [ ! -x /usr/sbin/sshd ]; then missing="$$missing openssh-server"; fi; \
	compose=""; \
	if ! command -v docker-compose >/dev/null 2>&1; then compose=" docker-compose"; fi; \
	if [ -n "$$missing$$compose" ]; then \
	  if [ "$$(id -u)" -eq 0 ]; then sudo=""; \
	  elif command -v sudo >/dev/null 2>&1; then sudo="sudo -n"; \
	  else echo "make setup: need root or sudo to install:$$missing$$compose" >&2; exit 1; fi; \
	  if ! command -v apt-get >/dev/null 2>&1; then \
	    echo "make setup: no apt-get here; install these yourself:$$missing$$compose" >&2; exit 1; fi; \
	  echo "make setup: installing$$missing$$compose with apt-get"; \
	  apt="$$sudo env DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=600"; \
	  $$apt update; \
	  if [ -n "$$missing" ]; then $$apt install -y $$missing; fi; \
	  if [ -n "$$compose" ]; then $$apt install -y --no-install-recommends docker-compose; fi; \
	fi

# Reinstalls only when setup.cfg / pyproject.toml / setup.py / the C extension's source change, or the venv moved
# or got another python, or the C extension (built in place by the editable install) is missing.
python-env: system-packages
	@py=$$($(FIND_PYTHON)); \
	if [ -z "$$py" ]; then echo "make setup: no python >= 3.11 found" >&2; exit 1; fi; \
	if ! $(PY) -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; then \
	  echo "make setup: creating $(VENV) with $$py"; \
	  rm -rf $(VENV); \
	  "$$py" -m venv $(VENV); \
	fi; \
	want="$$(sha256sum setup.cfg pyproject.toml setup.py relayproxy/downstream/_sendbatch.c relayproxy/relay/_fsync.c; echo "$(CURDIR)"; $(PY) -VV)"; \
	if [ "$$(cat $(STAMP) 2>/dev/null)" != "$$want" ] \
	    || ! $(PY) -c 'import relayproxy.downstream._sendbatch, relayproxy.relay._fsync' >/dev/null 2>&1; then \
	  echo "make setup: installing relayproxy[test] into $(VENV)"; \
	  $(PY) -m pip install -q --disable-pip-version-check -e '.[test]'; \
	  printf '%s\n' "$$want" > $(STAMP); \
	fi

demo: setup
	$(VENV)/bin/relayproxy demo $(DEMO_ARGS)

# pytest exits 5 when it collected no test: that is a failure here, never a pass.
# Two worker processes (pytest-xdist), a test file each at a time: most of a server test's time is waiting (for
# a server, a timeout, a replica), so two files overlap their waits on a 2-core machine. TEST_WORKERS=0 runs the
# suite in one process. Each worker takes its ports from a range of its own (lab/relayprocess.py, free_port).
TEST_WORKERS ?= 2
test: setup
	@rc=0; $(PY) -m pytest -rfEs -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests, which counts as a failure" >&2; fi; \
	exit $$rc

# The tests marked server, spark, docker, mha or slow (setup.cfg; tests/conftest.py fails a test that starts a server,
# a JVM or docker-compose without its marker) left out: under two minutes on a 2-core machine. Not what CI runs.
QUICK_MARKERS := not server and not spark and not docker and not mha and not slow
test-quick: setup
	@rc=0; $(PY) -m pytest -q -rfEs -n $(TEST_WORKERS) --dist loadfile -m "$(QUICK_MARKERS)" $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-quick: pytest collected no tests, which counts as a failure" >&2; fi; \
	exit $$rc

lint: setup
	$(PY) -m compileall -q relayproxy tests
	@if $(PY) -m ruff --version >/dev/null 2>&1; then $(PY) -m ruff check relayproxy tests; \
	else echo "ruff is not installed in $(VENV) ($(PY) -m pip install ruff); ran compileall only"; fi

# Every benchmark with its defaults, on the current checkout; each rewrites its own part of benchmarks/results/
# and records the commit and whether the code was clean. Long (the soak alone runs 10 minutes); not in `make test`.
# Spark reads the recorded streams of benchmarks/workloads.py (written first, into benchmarks/data/streams): every
# blob event of the full blobs shape, the other shapes at a quarter of their default size (a few minutes for 3 runs).
BENCH_PY := $(PY) -u
bench: setup
	$(BENCH_PY) benchmarks/parse_cost.py
	$(BENCH_PY) benchmarks/workloads.py --shapes blobs
	$(BENCH_PY) benchmarks/workloads.py --shapes oltp,bulk,ddl,xa,domains,statement --scale 0.25
	$(BENCH_PY) benchmarks/spark_parse_cost.py
	$(BENCH_PY) benchmarks/relay_catchup.py
	$(BENCH_PY) benchmarks/failover_time.py
	$(BENCH_PY) benchmarks/fanout.py
	$(BENCH_PY) benchmarks/hop_latency.py
	$(BENCH_PY) benchmarks/archive_lag.py
	$(BENCH_PY) benchmarks/soak.py --minutes 10 --seed 1 --fuzz-inputs 100000 --output benchmarks/results/soak.md
	@echo "make bench: every results file under benchmarks/results/ rewritten; git diff benchmarks/results/ shows what moved"

clean:
	rm -rf build dist .pytest_cache .hypothesis
	find relayproxy tests -name __pycache__ -type d -prune -exec rm -rf {} +
