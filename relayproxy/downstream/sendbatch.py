"""The shared pass's socket writes, many sockets per call, with the GIL released (dump/followers.py).

At a horizon advance the pass has one write for each replica parked at the horizon. Made one by one through the
event loop's transports they cost a Python call chain each on top of the kernel's send, all of it under the GIL on
one core. Here they are gathered (``Pass.queue``: only for sockets whose transport holds nothing unsent, so the
bytes cannot overtake anything) and written by ``_sendbatch.send_batch`` (C: one ``sendmsg`` per socket, the GIL
released for the whole batch). With ``threads`` > 1 a large batch is split: the loop's thread writes one part while
helper threads write the others, so the kernel's work for a pass runs on as many cores. The call returns when every
part is written; what a socket did not take (full, or an error) is handed to its transport afterwards, which queues
the rest or reports the error in its own way, exactly as if it had been given the whole write.

Without the C extension (no compiler at install time, or ``RELAYPROXY_PURE_PYTHON=1`` in the environment: the
pure-Python build, which tests/project/test_pure_python.py runs in every ``make test``) ``available()`` is False and the
pass writes through the transports (one ``transport.write`` each); the tests run both.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any

try:
    if os.environ.get("RELAYPROXY_PURE_PYTHON") == "1":
        raise ImportError("RELAYPROXY_PURE_PYTHON=1")
    from ._sendbatch import send_batch as _send_batch
except ImportError:  # built without a compiler: the pass writes through the transports
    _send_batch = None

# A batch is split across threads from this many sockets on (below it, handing a part over costs more than it saves).
SPLIT_MIN = 16


def available() -> bool:
    return _send_batch is not None


class _Helper:
    """A thread that writes the parts of batches handed to it (one per process: a forked child gets its own)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.done: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="relay-send", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            items = self.jobs.get()
            try:
                self.done.put(_send_batch(items))
            except BaseException as exc:  # handed back to the pass, which raises it
                self.done.put(exc)


_helpers: list[_Helper] = []


def _helpers_for(n: int) -> list[_Helper]:
    pid = os.getpid()
    if _helpers and _helpers[0].pid != pid:
        _helpers.clear()  # threads do not survive a fork
    while len(_helpers) < n:
        _helpers.append(_Helper())
    return _helpers[:n]


def send(items: list[tuple[int, Any]], threads: int = 1) -> list[int]:
    """``send_batch(items)``, split over ``threads`` threads (this one and helpers) when the batch is large."""
    parts = min(threads, len(items) // SPLIT_MIN) if threads > 1 else 1
    if parts <= 1:
        return _send_batch(items)
    size = -(-len(items) // parts)
    helpers = _helpers_for(parts - 1)
    for k, helper in enumerate(helpers, start=1):
        helper.jobs.put(items[k * size:(k + 1) * size])
    failure: BaseException | None = None
    try:
        results = _send_batch(items[:size])
    except BaseException as exc:
        failure, results = exc, []
    for helper in helpers:  # always collected: a result left behind would be taken by the next batch
        part = helper.done.get()
        if isinstance(part, BaseException):
            failure = failure or part
        else:
            results.extend(part)
    if failure is not None:
        raise failure
    return results


THREADS = 1  # threads a pass writes with (the ``send_threads`` option; set by the command that serves)


def configure(threads: int) -> None:
    global THREADS
    THREADS = max(1, int(threads))
