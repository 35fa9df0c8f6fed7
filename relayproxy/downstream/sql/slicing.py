"""One statement's work in slices, so that no statement holds the event loop (invariant 7) whatever its shape.

The SQL layer is synchronous: a tokenizer, a recursive-descent parser and a tree evaluator, each bounded by
limits.py (tokens, terms, depth, evaluation steps). Those bounds keep a statement's *total* work in O(limit),
but ten thousand terms are still a few hundred milliseconds of Python; run in one piece on the event loop they
would stall the upstream stream, every replica and ``/status`` for that long.

``run_sliced(fn, *args)`` runs ``fn`` in a greenlet on the event loop's own thread. The tokenizer, the parser and
the evaluator report their work with ``work(units)``; after ``WORK_PER_SLICE`` units the statement's greenlet
switches back to the coroutine, which lets the loop turn once (``await asyncio.sleep(0)``: every ready callback
runs, the upstream receives, replicas are written to, /status answers) and then resumes the statement where it
stopped. One unit is about one token's worth of Python (a few microseconds on a busy core), so a slice is a few
hundred of them: about a millisecond.

Why a greenlet and not a worker thread: the statement stays on the loop's thread, so everything it touches (the
store, the connections table, KILL's transports) is touched from the thread that owns it, between two
callbacks, as with any statement; and pure-Python parsing in a thread would still hold the GIL against the loop for up to the
interpreter's switch interval at every hand-off. Outside ``run_sliced`` (``execute_sync``, tests, the CLI)
``work`` costs one call and never pauses.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any, Callable

from greenlet import getcurrent, greenlet

# Units of work between two turns of the event loop. A unit is about one token read, one token consumed and one
# node built by the parser, or one evaluation step (limits.Budget); the tokenizer charges long scans (a string's
# escapes, runs of comments) in proportion. Measured on the 2-core test machine under load, a slice of 256 units
# is 0.3 to 1.5 ms of CPU (tests/downstream/test_sql_slicing.py counts the work per turn; docs/operations.md has the numbers).
WORK_PER_SLICE = 256

_PAUSED = object()


class _Statement(greenlet):
    """The greenlet one statement runs in: the work done since its last pause, and how many pauses so far."""

    def __init__(self, run: Callable[..., Any], parent: greenlet):
        super().__init__(run, parent)
        self.work = 0
        self.pauses = 0


def work(units: int = 1) -> None:
    """Count ``units`` of work done by the current statement; past the slice, let the event loop turn first.

    A no-op outside ``run_sliced``."""
    current = getcurrent()
    if current.__class__ is _Statement:
        current.work += units
        if current.work >= WORK_PER_SLICE:
            current.work = 0
            current.pauses += 1
            current.parent.switch(_PAUSED)


class _Offload:
    """A call the statement hands to a worker thread (``in_thread``): run_sliced awaits it, the loop runs meanwhile."""

    __slots__ = ("fn", "args", "result", "error")

    def __init__(self, fn: Callable[..., Any], args: tuple):
        self.fn, self.args = fn, args
        self.result: Any = None
        self.error: Exception | None = None


def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a worker thread when the statement runs under ``run_sliced`` (disk reads: the event loop
    never waits on them; the statement's greenlet is parked until the thread is done); directly otherwise."""
    current = getcurrent()
    if current.__class__ is not _Statement:
        return fn(*args)
    job = _Offload(fn, args)
    current.parent.switch(job)
    if job.error is not None:
        raise job.error
    return job.result


async def run_sliced(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, run a slice at a time between turns of the event loop; its result, or what it raised.

    If the awaiting task is cancelled (the client went away), the statement is unwound (``GreenletExit`` at its
    pause, its ``finally`` blocks run) before the cancellation goes on."""
    statement = _Statement(fn, getcurrent())
    statement.gr_context = contextvars.copy_context()  # the connection's log context, as on the loop
    try:
        result = statement.switch(*args)
        while not statement.dead:
            if result.__class__ is _Offload:
                try:
                    result.result = await asyncio.to_thread(result.fn, *result.args)
                except Exception as exc:  # noqa: BLE001 - raised again in the statement
                    result.error = exc
            else:
                await asyncio.sleep(0)
            result = statement.switch()
        return result
    finally:
        if not statement.dead:
            statement.throw()  # GreenletExit: unwinds the statement's stack, returns here
