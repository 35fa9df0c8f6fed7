"""Process-wide logging set-up: structlog on top of the stdlib, JSON lines for machines, colours for people."""

from __future__ import annotations

import logging
import os
import secrets
import sys
import time
from typing import Any, Callable

import structlog

FORMATS = ("auto", "json", "console")

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}

# Keys every JSON line starts with, in this order; the event's own keys follow.
_LEADING_KEYS = ("timestamp", "level", "logger", "event")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at emit time, so a replaced stderr (pytest capture, redirect) is honoured."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def _leading_keys_first(_logger: Any, _method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    ordered = {key: event_dict.pop(key) for key in _LEADING_KEYS if key in event_dict}
    ordered.update(event_dict)
    return ordered


def _parse_level(level: str | int) -> int:
    if isinstance(level, int):
        return level
    try:
        return _LEVELS[level.strip().lower()]
    except KeyError:
        raise ValueError(f"unknown log level {level!r}: use one of debug, info, warning, error, critical") from None


def _use_json(fmt: str) -> bool:
    if fmt not in FORMATS:
        raise ValueError(f"unknown log format {fmt!r}: use one of {', '.join(FORMATS)}")
    if fmt == "auto":
        isatty = getattr(sys.stderr, "isatty", None)
        return not (isatty is not None and isatty())
    return fmt == "json"


_settings = {"format": "json", "level": "info"}  # as configure_logging() last resolved them


def logging_settings() -> dict[str, str]:
    """The format (json or console) and level in force: what a sender process is started with."""
    return dict(_settings)


def configure_logging(fmt: str = "auto", level: str | int = "info") -> None:
    """Send all logs (ours and the stdlib's) to stderr: JSON lines when fmt is json or stderr is not a terminal.

    Calling it again replaces the previous set-up rather than adding to it.
    """
    level_no = _parse_level(level)
    use_json = _use_json(fmt)
    _settings["format"] = "json" if use_json else "console"
    _settings["level"] = logging.getLevelName(level_no).lower()

    # Run for structlog loggers before the record reaches the stdlib, and for stdlib records in the formatter.
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
        structlog.processors.StackInfoRenderer(),
    ]
    if use_json:
        renderer: list[Any] = [
            structlog.processors.format_exc_info,
            _leading_keys_first,
            structlog.processors.JSONRenderer(default=str),
        ]
    else:
        colors = bool(getattr(sys.stderr, "isatty", lambda: False)())
        renderer = [structlog.dev.ConsoleRenderer(colors=colors)]

    structlog.configure(
        processors=[structlog.stdlib.filter_by_level, *shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        # Not cached: a second configure_logging() must reach loggers that already logged.
        cache_logger_on_first_use=False,
    )

    handler = _StderrHandler()
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderer],
        )
    )
    handler._relayproxy = True  # type: ignore[attr-defined]

    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_relayproxy", False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level_no)


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """A structlog logger named `name` (use the module's __name__); sets up default logging if nobody has yet."""
    if not structlog.is_configured():
        configure_logging()
    return structlog.get_logger(name)


class PeerLogLimiter:
    """At most `lines` log lines per peer host per `window` seconds, so that a client cannot flood the log:
    `admit(host)` is None for a line to drop, else how many were dropped since that host's last line (to report
    with it)."""

    _HOSTS_MAX = 4096  # hosts remembered before entries of past windows are dropped

    def __init__(self, lines: int = 10, window: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.lines = lines
        self.window = window
        self._clock = clock
        self._hosts: dict[str, list[float]] = {}  # host -> [window start, lines in it, suppressed]

    def admit(self, host: str) -> int | None:
        now = self._clock()
        entry = self._hosts.get(host)
        if entry is None or now - entry[0] >= self.window:
            if entry is None and len(self._hosts) >= self._HOSTS_MAX:
                self._hosts = {h: e for h, e in self._hosts.items() if now - e[0] < self.window}
            suppressed = int(entry[2]) if entry is not None else 0
            self._hosts[host] = [now, 1, 0]
            return suppressed
        if entry[1] < self.lines:
            entry[1] += 1
            suppressed, entry[2] = int(entry[2]), 0
            return suppressed
        entry[2] += 1
        return None


def report_failure(logger, limiter: PeerLogLimiter, host: str, event: str, exc: BaseException,
                   **fields: Any) -> str:
    """A failure that is not the client's doing (a bug), reported as one log line, never a traceback at the
    default level: a client able to trigger it could otherwise fill the disk. The line carries a reference id
    (returned, for the answer the client gets), the error and where it was raised; at most the limiter's budget
    of lines per peer host (the drops are counted on the next line); the traceback goes to debug level."""
    ref = secrets.token_hex(4)
    suppressed = limiter.admit(host or "?")
    if suppressed is not None:
        if suppressed:
            fields["suppressed_before"] = suppressed
        logger.error(event, ref=ref, error=f"{type(exc).__name__}: {str(exc)[:200]}", where=where(exc), **fields)
    logger.debug(f"{event}: traceback", ref=ref, exc_info=exc)
    return ref


def where(exc: BaseException) -> str:
    """file:line in function of the innermost frame of `exc`'s traceback: a one-line stand-in for it."""
    tb = exc.__traceback__
    if tb is None:
        return "?"
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    return f"{os.path.basename(code.co_filename)}:{tb.tb_lineno} in {code.co_name}"
