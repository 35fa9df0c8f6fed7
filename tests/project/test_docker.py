"""The docker/ files, checked without a Docker engine: both compose files validated by docker-compose, and every
relayproxy subcommand, flag and RELAYPROXY_* variable used by them, the Dockerfile and the failure story
accepted by the real CLI; the healthcheck run against a local /status; the slow link run for real."""

from __future__ import annotations

import argparse
import asyncio
import configparser
import contextlib
import functools
import http.server
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from relayproxy.commands import cli, config
from relayproxy.relay.retention import parse_duration

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
STORY = DOCKER / "failure-story.sh"
SLOWLINK = DOCKER / "slowlink.py"
COMPOSE_FLAVOURS = {"docker-compose.yml": "mysql", "docker-compose.mariadb.yml": "mariadb"}
SERVICES = {"master", "link", "relayproxy", "replica-relay", "replica-direct"}
DATABASE_SERVICES = ("master", "replica-relay", "replica-direct")
KNOWN_ENV = {o.env for o in config.OPTIONS} | {config.ENV_PREFIX + "CONFIG"}
ENV_TOKEN = re.compile(r"\bRELAYPROXY_[A-Z0-9_]+\b")

pytestmark = pytest.mark.docker


# -- helpers: docker-compose, the CLI, the Dockerfile ---------------------------------------------------------------


def compose_program() -> list[str]:
    program = shutil.which("docker-compose")
    if program is None:
        pytest.fail(
            "docker-compose is not installed: `make setup` installs it (Debian's docker-compose package); "
            "the compose files cannot be validated without it"
        )
    return [program]


def compose_env() -> dict[str, str]:
    # The files' own defaults, not whatever this shell exports.
    return {k: v for k, v in os.environ.items() if k not in ("LINK_RATE", "COMPOSE_FILE", "COMPOSE_PROJECT_NAME")}


@functools.cache
def normalized_config(name: str) -> dict:
    """`docker-compose -f FILE config` (which validates the file) as a dict."""
    program = compose_program()
    base = [*program, "--file", str(DOCKER / name), "config"]
    checked = subprocess.run(base, capture_output=True, text=True, env=compose_env(), timeout=60)
    assert checked.returncode == 0, f"docker-compose config rejects {name}:\n{checked.stderr}"
    version = subprocess.run([*program, "version", "--short"], capture_output=True, text=True, timeout=60)
    if version.returncode == 0 and not version.stdout.strip().startswith("1."):
        as_json = subprocess.run([*base, "--format", "json"], capture_output=True, text=True, env=compose_env(),
                                 timeout=60)
        assert as_json.returncode == 0, as_json.stderr
        return json.loads(as_json.stdout)
    # docker-compose v1 prints only YAML; read it with the YAML library docker-compose itself runs on, so
    # the suite needs no YAML dependency of its own.
    interpreter = Path(program[0]).read_text(errors="replace").splitlines()[0].removeprefix("#!").split()
    to_json = "import json, sys, yaml; json.dump(yaml.safe_load(sys.stdin), sys.stdout)"
    converted = subprocess.run([*interpreter, "-c", to_json], input=checked.stdout, capture_output=True, text=True,
                               timeout=60)
    assert converted.returncode == 0, f"cannot read docker-compose's output as YAML:\n{converted.stderr}"
    return json.loads(converted.stdout)


def parse_cli(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse like the program would; a rejected argument fails the test with argparse's own message."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return parser.parse_args(argv)
    except SystemExit:
        pytest.fail(f"{parser.prog} rejects {argv}: {stderr.getvalue().strip()}")


def relayproxy_args(argv: list[str]) -> argparse.Namespace:
    args = parse_cli(cli.build_parser(), argv)
    assert args.command in cli.SUBCOMMANDS
    return args


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    instructions, pending = [], ""
    for line in (DOCKER / "Dockerfile").read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, rest = (pending + line).strip().partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        pending = ""
    return instructions


def dockerfile(keyword: str) -> list[str]:
    return [rest for kw, rest in dockerfile_instructions() if kw == keyword]


def final_stage() -> list[tuple[str, str]]:
    instructions = dockerfile_instructions()
    last_from = max(i for i, (kw, _) in enumerate(instructions) if kw == "FROM")
    return instructions[last_from:]


def dockerfile_env() -> dict[str, str]:
    env = {}
    for kw, rest in final_stage():
        if kw == "ENV":
            for token in shlex.split(rest):
                key, _, value = token.partition("=")
                env[key] = value
    return env


def dockerfile_healthcheck() -> list[str]:
    (healthcheck,) = dockerfile("HEALTHCHECK")
    _options, _, command = healthcheck.partition(" CMD ")
    assert command, f"HEALTHCHECK without CMD: {healthcheck}"
    return ["CMD", *json.loads(command)]


def mounts(service: dict) -> set[tuple[str, str, bool]]:
    """(source, target, read-only) of each volume; docker-compose v1 prints "SRC:TARGET[:MODE]", v2 tables."""
    found = set()
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target, *mode = volume.split(":")
            found.add((source, target, mode == ["ro"]))
        else:
            found.add((volume["source"], volume["target"], bool(volume.get("read_only"))))
    return found


def secret_paths(compose: dict, service: dict) -> dict[str, str]:
    """/run/secrets/TARGET in the container -> the file on this machine."""
    paths = {}
    for entry in service.get("secrets", []):
        source = entry if isinstance(entry, str) else entry["source"]
        target = source if isinstance(entry, str) else entry.get("target", source)
        paths[f"/run/secrets/{target}"] = compose["secrets"][source]["file"]
    return paths


def host_environment(compose: dict, name: str) -> dict[str, str]:
    """A service's environment with its secret paths pointing at the files docker would mount there."""
    service = compose["services"][name]
    env = {**dockerfile_env(), **{k: str(v) for k, v in service.get("environment", {}).items()}}
    for container_path, host_path in secret_paths(compose, service).items():
        env = {k: v.replace(container_path, host_path) for k, v in env.items()}
    return env


def load_slowlink():
    spec = importlib.util.spec_from_file_location("docker_slowlink", SLOWLINK)
    module = importlib.util.module_from_spec(spec)
    writes_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # no __pycache__ in docker/
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = writes_bytecode
    return module


class StatusRecorder(http.server.BaseHTTPRequestHandler):
    paths: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        StatusRecorder.paths.append(self.path)
        body = b'{"io_running": true}'
        self.send_response(200 if self.path == "/status" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def status_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StatusRecorder)
    StatusRecorder.paths = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def run_healthcheck(test: list[str], http: str) -> subprocess.CompletedProcess:
    assert test[:3] == ["CMD", "python", "-c"], f"healthcheck is not a python one-liner: {test}"
    env = {**os.environ, "RELAYPROXY_HTTP": http}
    return subprocess.run([sys.executable, "-c", test[3]], env=env, capture_output=True, text=True, timeout=30)


# -- the compose files ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", COMPOSE_FLAVOURS)
def test_compose_file_is_valid_and_has_the_whole_topology(name):
    compose = normalized_config(name)
    services = compose["services"]
    assert set(services) == SERVICES
    image = {"mysql": "mysql:8.4", "mariadb": "mariadb:11.4"}[COMPOSE_FLAVOURS[name]]
    for db in DATABASE_SERVICES:
        assert services[db]["image"] == image
    for built in ("relayproxy", "link"):
        assert services[built]["build"]["dockerfile"] == "docker/Dockerfile"
        assert Path(services[built]["build"]["context"]) == ROOT
    for secret in compose["secrets"].values():
        assert Path(secret["file"]).is_file() and Path(secret["file"]).read_text().strip(), secret
    # The topology: replica-relay waits for a healthy relay; the link for a healthy master.
    assert services["replica-relay"]["depends_on"]["relayproxy"]["condition"] == "service_healthy"
    assert services["link"]["depends_on"]["master"]["condition"] == "service_healthy"


@pytest.mark.parametrize("name", COMPOSE_FLAVOURS)
def test_relayproxy_service_uses_only_what_the_cli_accepts(name):
    compose = normalized_config(name)
    service = compose["services"]["relayproxy"]
    assert "entrypoint" not in service  # the image's: relayproxy (checked in the Dockerfile test)
    args = relayproxy_args(service["command"])
    assert args.command == "run"
    for variable in service.get("environment", {}):
        assert variable in KNOWN_ENV, f"{variable} is not a relayproxy option (relayproxy run --help)"
    env = host_environment(compose, "relayproxy")
    cfg = config.load(args, environ=env)  # converts and validates every value, users and all
    cfg.require("master", "user", "server_id", "relay_dir")
    (password_file,) = [path for target, path in secret_paths(compose, service).items()
                        if target == service["environment"]["RELAYPROXY_PASSWORD_FILE"]]
    assert cfg.resolved_password() == Path(password_file).read_text().splitlines()[0]
    assert cfg.gtid_mode == COMPOSE_FLAVOURS[name]
    assert cfg.listen is not None and cfg.http is not None
    # Replicas log in to the relay with the master's replication account and password.
    assert [(u.name, u.password) for u in cfg.users] == [(cfg.user, cfg.resolved_password())]
    # The relay directory is the volume; the relay goes through the link, and the link to the master.
    assert ("relay-data", cfg.relay_dir, False) in mounts(service)
    link_args = parse_cli(load_slowlink().build_parser(), compose["services"]["link"]["command"])
    assert cfg.master == ("link", link_args.listen[1])
    assert link_args.upstream == ("master", 3306)


@pytest.mark.parametrize("name", COMPOSE_FLAVOURS)
def test_relayproxy_healthcheck_asks_status_on_the_http_address(name):
    compose = normalized_config(name)
    service = compose["services"]["relayproxy"]
    test = service["healthcheck"]["test"]
    assert test == dockerfile_healthcheck(), "the compose healthcheck differs from the Dockerfile's"
    # It reads RELAYPROXY_HTTP, which the service sets (a --http flag would leave the healthcheck behind).
    assert "--http" not in service["command"]
    cfg = config.load(relayproxy_args(service["command"]), environ=host_environment(compose, "relayproxy"))
    assert cfg.sources["http"] == "environment RELAYPROXY_HTTP" and cfg.http[0] == "0.0.0.0"
    assert str(cfg.http[1]) in " ".join(dockerfile("EXPOSE")).split()
    with status_server() as port:
        # The same wildcard host the service uses, on a port served here: asked on 127.0.0.1, path /status.
        result = run_healthcheck(test, f"0.0.0.0:{port}")
        assert result.returncode == 0, result.stderr
        assert StatusRecorder.paths == ["/status"]
    with status_server() as port:
        pass
    result = run_healthcheck(test, f"0.0.0.0:{port}")  # nothing listens there any more
    assert result.returncode != 0


def test_a_supervisor_waits_well_past_the_dumps_stop_grace_before_sigkill():
    """On SIGTERM each dump first ends the transaction it is sending, for up to ``dump_stop_grace``; a supervisor
    that sends SIGKILL before that cuts them anyway (a MariaDB file/position replica then stops until START SLAVE).
    The systemd unit in docs/operations.md and both compose files give the relay at least three times the grace."""
    grace = config.OPTION_BY_NAME["dump_stop_grace"].default
    unit = (ROOT / "docs" / "operations.md").read_text()
    (timeout,) = re.findall(r"^TimeoutStopSec=(\d+)$", unit, re.MULTILINE)
    waits = {"systemd unit (docs/operations.md)": float(timeout)}
    for name in COMPOSE_FLAVOURS:
        period = normalized_config(name)["services"]["relayproxy"].get("stop_grace_period", "10s")  # Docker's default
        waits[name] = parse_duration(period)
    assert grace > 0 and all(wait >= 3 * grace for wait in waits.values()), (grace, waits)


@pytest.mark.parametrize("name", COMPOSE_FLAVOURS)
def test_database_services_have_replication_settings_and_unique_server_ids(name):
    compose = normalized_config(name)
    services = compose["services"]
    flavour = COMPOSE_FLAVOURS[name]
    ids = {}
    for db in DATABASE_SERVICES:
        flags = services[db]["command"]
        (server_id,) = [int(f.split("=", 1)[1]) for f in flags if f.startswith("--server-id=")]
        ids[db] = server_id
        if flavour == "mysql":
            assert {"--gtid-mode=ON", "--enforce-gtid-consistency=ON"} <= set(flags)
    ids["relayproxy"] = int(services["relayproxy"]["environment"]["RELAYPROXY_SERVER_ID"])
    assert len(set(ids.values())) == len(ids), f"server ids must be unique in the topology: {ids}"
    assert "--log-bin=mysql-bin" in services["master"]["command"]
    assert "--binlog-format=ROW" in services["master"]["command"]
    skip_start = "--skip-replica-start" if flavour == "mysql" else "--skip-slave-start"
    for replica in ("replica-relay", "replica-direct"):
        assert skip_start in services[replica]["command"]
    # The replication account is created from the secret by the init script, sourced by the image's entrypoint.
    assert (str(DOCKER / "initdb"), "/docker-entrypoint-initdb.d", True) in mounts(services["master"])
    assert "/run/secrets/replication_password" in secret_paths(compose, services["master"])
    init = DOCKER / "initdb" / "10-replication-user.sh"
    assert not os.access(init, os.X_OK), "the entrypoint must source it (docker_process_sql), not run it"
    assert "/run/secrets/replication_password" in init.read_text()
    assert "caching_sha2_password" in init.read_text()


@pytest.mark.parametrize("name", COMPOSE_FLAVOURS)
def test_link_service_runs_the_slow_link_with_its_own_flags(name):
    service = normalized_config(name)["services"]["link"]
    assert service["entrypoint"] == ["python", "/opt/relayproxy-story/slowlink.py"]
    assert (str(SLOWLINK), "/opt/relayproxy-story/slowlink.py", True) in mounts(service)
    args = parse_cli(load_slowlink().build_parser(), service["command"])
    assert args.rate == 4 * 1024 * 1024  # ${LINK_RATE:-4194304}


# -- the Dockerfile and .dockerignore --------------------------------------------------------------------------


def test_dockerfile_runs_the_relayproxy_console_script_as_a_non_root_user():
    (image,) = [rest for kw, rest in final_stage() if kw == "FROM"]
    assert image == "${PYTHON_IMAGE}"
    (default_image,) = [rest for rest in dockerfile("ARG") if rest.startswith("PYTHON_IMAGE=")]
    assert re.fullmatch(r"PYTHON_IMAGE=python:3\.1[1-3]-slim(-\w+)?", default_image), default_image
    (user,) = [rest for kw, rest in final_stage() if kw == "USER"]
    assert user.split(":")[0] not in ("root", "0"), "the relay must not run as root"
    assert any(re.search(rf"useradd\b[^&]*\b{re.escape(user)}\b", rest) for kw, rest in final_stage() if kw == "RUN")
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    scripts = dict(line.split("=", 1) for line in setup["options.entry_points"]["console_scripts"].split("\n")
                   if line.strip())
    (entrypoint,) = dockerfile("ENTRYPOINT")
    assert json.loads(entrypoint) == ["relayproxy"]
    assert {k.strip(): v.strip() for k, v in scripts.items()}["relayproxy"] == "relayproxy.commands.cli:main"
    (cmd,) = dockerfile("CMD")
    args = relayproxy_args(json.loads(cmd))
    env = dockerfile_env()
    for variable in (k for k in env if k.startswith(config.ENV_PREFIX)):
        assert variable in KNOWN_ENV, variable
    cfg = config.load(args, environ=env)
    assert cfg.relay_dir == "/var/lib/relayproxy"
    assert dockerfile("VOLUME") == [cfg.relay_dir]
    exposed = {int(port) for rest in dockerfile("EXPOSE") for port in rest.split()}
    assert cfg.http[1] in exposed and 3306 in exposed


def test_dockerfile_healthcheck_asks_status_on_relayproxy_http():
    test = dockerfile_healthcheck()
    assert "/status" in test[3]
    with status_server() as port:
        result = run_healthcheck(test, f"127.0.0.1:{port}")
        assert result.returncode == 0, result.stderr
        assert StatusRecorder.paths == ["/status"]


def test_dockerfile_builds_a_wheel_from_files_the_dockerignore_lets_through():
    build = dockerfile_instructions()
    copies = [rest.split()[:-1] for kw, rest in build if kw == "COPY" and not rest.startswith("--from")]
    sources = {source for copy in copies for source in copy}
    assert sources == {"pyproject.toml", "setup.cfg", "setup.py", "README.md", "relayproxy"}
    (wheel_and_install,) = [rest for kw, rest in build if kw == "RUN" and "pip wheel" in rest]
    assert re.search(r"pip install --no-index --find-links /wheels relayproxy\b", wheel_and_install)
    # The runtime stage takes the virtualenv the wheels went into, and puts it first on PATH.
    assert ("COPY", "--from=build /opt/relayproxy /opt/relayproxy") in final_stage()
    assert dockerfile_env()["PATH"].startswith("/opt/relayproxy/bin:")
    assert ("RUN", "relayproxy --version") in final_stage()
    ignore = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
              if line.strip() and not line.lstrip().startswith("#")]
    assert ignore[0] == "*", "an allow-list: nothing (no .venv, no docker/secrets) goes to the build by default"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert sources <= allowed
    for source in sources:
        assert (ROOT / source).exists(), source


# -- the failure story script ------------------------------------------------------------------------------------


def test_failure_story_script_parses_and_uses_only_what_the_cli_accepts():
    assert os.access(STORY, os.X_OK)
    syntax = subprocess.run(["bash", "-n", str(STORY)], capture_output=True, text=True, timeout=30)
    assert syntax.returncode == 0, syntax.stderr
    text = STORY.read_text()
    assert "set -euo pipefail" in text
    for variable in set(ENV_TOKEN.findall(text)):
        assert variable in KNOWN_ENV, variable
    # Every `relayproxy SUBCOMMAND ...` the script runs (in the relay's container) parses.
    invocations = re.findall(r"\brelayproxy relayproxy (\w[^)|;&\n]*)", text)
    assert invocations, "the script should ask the relay with `relayproxy status`"
    for invocation in invocations:
        relayproxy_args(shlex.split(invocation))
    # Every service it names exists in both topologies.
    named = set(re.findall(r"\b(?:exec -T|sql|replica_status|wait_applied|wait_ready) \"?([a-z][a-z-]+)\b", text))
    named |= set(re.findall(r"kill -s SIGKILL ([a-z-]+)", text))
    named |= set(re.findall(r"for service in ([a-z -]+);", text)[0].split())
    assert named - {"service"} <= SERVICES, named - SERVICES
    for name in COMPOSE_FLAVOURS:
        relay = normalized_config(name)["services"]["relayproxy"]
        env = relay.get("environment", {})
        if "RELAYPROXY_TLS_CERT" not in env:
            if COMPOSE_FLAVOURS[name] == "mysql":
                # caching_sha2_password without TLS on --listen: the replica must fetch the relay's RSA key.
                assert "GET_SOURCE_PUBLIC_KEY=1" in text
            else:
                # MariaDB 11.4 replicas require TLS by default: not from a relay without a certificate.
                assert "MASTER_SSL=0" in text
    assert "SOURCE_AUTO_POSITION=1" in text and "MASTER_USE_GTID=slave_pos" in text
    # `relayproxy status` must be asked on the port the relay serves /status on.
    (status_call,) = [shlex.split(i) for i in invocations if i.startswith("status")]
    asked_port = config.load(relayproxy_args(status_call), environ={}).http[1]
    for name in COMPOSE_FLAVOURS:
        served = normalized_config(name)["services"]["relayproxy"]["environment"]["RELAYPROXY_HTTP"]
        assert served.endswith(f":{asked_port}")


def test_failure_story_help_runs_without_docker():
    result = subprocess.run(["bash", str(STORY), "--help"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert "--mariadb" in result.stdout and "kill -9" in result.stdout
    bad = subprocess.run(["bash", str(STORY), "--rows", "lots"], capture_output=True, text=True, timeout=30)
    assert bad.returncode != 0 and "--rows needs a positive integer" in bad.stderr


# -- the slow link ---------------------------------------------------------------------------------------------


def test_slow_link_forwards_the_masters_bytes_unchanged_and_no_faster_than_its_rate():
    slowlink = load_slowlink()
    payload = bytes(range(256)) * 256  # 64 KiB
    piece, rate = 4096, 40960  # 0.1 s a piece: the whole payload takes 1.6 s

    async def scenario():
        async def master(reader, writer):
            writer.write(payload)
            await writer.drain()
            writer.close()

        upstream = await asyncio.start_server(master, "127.0.0.1", 0)
        port = upstream.sockets[0].getsockname()[1]
        args = parse_cli(slowlink.build_parser(), ["--listen", "127.0.0.1:0", "--upstream", f"127.0.0.1:{port}",
                                                   "--rate", str(rate), "--piece", str(piece)])
        stop = asyncio.Event()
        started = asyncio.get_running_loop().create_future()
        link = asyncio.create_task(slowlink.serve(args, stop, started))
        proxy = await started
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        first = await reader.readexactly(1)
        began = time.monotonic()
        await asyncio.sleep(0.35)
        forwarded, elapsed = proxy.stats().server_to_client, time.monotonic() - began
        rest = await reader.read()
        writer.close()
        stop.set()
        await link
        upstream.close()
        await upstream.wait_closed()
        return first + rest, forwarded, elapsed

    received, forwarded, elapsed = asyncio.run(scenario())
    assert received == payload
    # An upper bound only (a slow machine forwards less, never more): one piece per delay, plus the first.
    assert forwarded <= piece * (2 + elapsed * rate / piece), (forwarded, elapsed)
    assert forwarded < len(payload)


def test_slow_link_rejects_bad_arguments_by_name():
    parser = load_slowlink().build_parser()
    for argv, message in (
        (["--listen", "3306", "--upstream", "master:3306"], "expected HOST:PORT, got '3306'"),
        (["--listen", "0.0.0.0:3306", "--upstream", "master:3306", "--rate", "0"], "positive integer"),
        (["--listen", "0.0.0.0:3306"], "--upstream"),
    ):
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit):
            parser.parse_args(argv)
        assert message in stderr.getvalue()

