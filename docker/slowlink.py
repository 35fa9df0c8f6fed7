"""A rate-limited TCP link for the docker failure story: the master's stream trickles through it, so a large
transaction takes seconds to reach the relay and the direct replica and the master can be killed mid-send.

It is relayproxy's FaultProxy (relayproxy/lab/faultproxy.py) with two flow-wide faults on the server→client flow:
`fragment` (forward at most --piece bytes per write) and `delay` (wait piece/rate seconds before each write).
The proxy reads one chunk from the master and forwards it before reading the next, so the master's TCP window
closes behind it and its binlog sender is throttled too. The rate is per connection. Plain TCP: TLS between the
relay and the master passes through untouched.

    python slowlink.py --listen 0.0.0.0:3306 --upstream master:3306 --rate 4194304
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from relayproxy.lab.faultproxy import SERVER_TO_CLIENT, FaultProxy, FaultProxyError
from relayproxy.log import configure_logging, get_logger

log = get_logger("relayproxy.slowlink")

DEFAULT_RATE = 4 * 1024 * 1024
DEFAULT_PIECE = 16 * 1024


def host_port(value: str) -> tuple[str, int]:
    """HOST:PORT for argparse; the error names what was wrong."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return number


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slowlink.py",
        description="Forward TCP connections to a master, trickling the master's bytes at a fixed rate.",
    )
    parser.add_argument("--listen", type=host_port, required=True, metavar="HOST:PORT",
                        help="address clients (the relay, a replica) connect to")
    parser.add_argument("--upstream", type=host_port, required=True, metavar="HOST:PORT", help="the master")
    parser.add_argument("--rate", type=positive_int, default=DEFAULT_RATE, metavar="BYTES_PER_SECOND",
                        help=f"server→client bytes per second, per connection (default {DEFAULT_RATE})")
    parser.add_argument("--piece", type=positive_int, default=DEFAULT_PIECE, metavar="BYTES",
                        help=f"largest write; one delay of piece/rate before each (default {DEFAULT_PIECE})")
    parser.add_argument("--log-level", default="info", help="debug, info, warning or error")
    return parser


def throttle(proxy: FaultProxy, rate: int, piece: int) -> float:
    """Make `proxy` forward the master's bytes at about `rate` bytes a second; returns the delay per piece."""
    delay = piece / rate
    proxy.fragment(piece, SERVER_TO_CLIENT)
    proxy.delay(delay, SERVER_TO_CLIENT)
    return delay


async def serve(args: argparse.Namespace, stop: asyncio.Event | None = None,
                started: asyncio.Future[FaultProxy] | None = None) -> None:
    """Run the link until SIGTERM/SIGINT (or until `stop` is set)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    handled = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
            handled.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass  # not the main thread (tests): `stop` ends the link
    proxy = FaultProxy(*args.upstream, listen_host=args.listen[0], listen_port=args.listen[1])
    try:
        async with proxy:
            delay = throttle(proxy, args.rate, args.piece)
            log.info("slow link up", listen=f"{proxy.listen_host}:{proxy.port}",
                     upstream=f"{args.upstream[0]}:{args.upstream[1]}", rate=args.rate, piece=args.piece,
                     delay=round(delay, 6))
            if started is not None:
                started.set_result(proxy)
            await stop.wait()
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(level=args.log_level)
    try:
        asyncio.run(serve(args))
    except FaultProxyError as exc:  # cannot listen: say so without a traceback
        print(f"slowlink.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
