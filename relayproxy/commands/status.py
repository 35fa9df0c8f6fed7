"""`relayproxy status`: ask a running relay for its status over HTTP and print it for a person."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request

from ..ops.status import format_status
from . import config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--http", metavar="HOST:PORT", help="the relay's --http address [env RELAYPROXY_HTTP]")
    parser.add_argument("--config", metavar="FILE", help="read the --http address from this TOML file")
    parser.add_argument("--json", action="store_true", help="print the raw JSON document")


def run(args: argparse.Namespace) -> int:
    try:
        cfg = config.load(args)
    except config.ConfigError as exc:
        print(f"relayproxy status: {exc}", file=sys.stderr)
        return 2
    if not cfg.http:
        print("relayproxy status: no --http address (flag, RELAYPROXY_HTTP or http in --config)", file=sys.stderr)
        return 2
    host, port = cfg.http
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}/status"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            status = json.load(response)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"relayproxy status: cannot read {url}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(status, indent=2) if args.json else format_status(status))
    return 0 if status.get("io_running") else 3
