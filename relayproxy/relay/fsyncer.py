"""The fsync thread of the per-transaction path: a sync ticket's fdatasync and durable mark run there, and the event
loop learns of the end through an eventfd it watches (``add_reader``). The thread is C (``_fsync.c``: no GIL) when
the extension is built, else ``PyWorker`` (the same contract in Python).

Beside the thread pool it replaced (``concurrent.futures``, still used for a ticket that also writes a recovery
checkpoint, every 16 MB or 10 s) it saves, per transaction: the pool's queue and semaphore, a
``concurrent.futures.Future`` with its condition, ``asyncio.wrap_future``'s chained future and
``call_soon_threadsafe``; the C thread also never needs the GIL: a Python thread that ends its fdatasync while the
loop runs Python waits for the GIL (up to the 5 ms switch interval) before the horizon can move.

The loop's side is the one every sync driver has: one ticket out at a time (``SyncTicket.submit_native``); its ``_job`` is a
``NativeJob``, which the store's operations that must not overlap an fsync (rotation, truncation, epoch switch,
close) wait for through ``SyncTicket.wait`` as they waited for a pool's future.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from typing import Callable

try:
    if os.environ.get("RELAYPROXY_PURE_PYTHON") == "1":  # the build without compiled extras (tests/project/test_pure_python.py)
        raise ImportError("RELAYPROXY_PURE_PYTHON=1")
    from ._fsync import Worker as CWorker
except ImportError:  # built without a compiler: PyWorker serves
    CWorker = None


def native() -> bool:
    """Whether the fsync thread is the C one (False: ``PyWorker``, without the extension)."""
    return CWorker is not None


class PyWorker:
    """The C ``Worker``'s contract in Python (``os.eventfd``, one thread): what serves without the extension, and
    what tests hold. Its thread needs the GIL around the syscalls, which the C one does not."""

    def __init__(self) -> None:
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._pid = os.getpid()
        self._cv = threading.Condition()
        self._job: tuple | None = None
        self._out = False
        self._finished = False
        self._result: tuple[int, int, float] | None = None
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="relay-fsync", daemon=True)
        self._thread.start()

    def _check(self) -> None:
        if self._efd < 0 or self._pid != os.getpid():
            raise ValueError("the fsync worker is closed (or belongs to another process)")

    def submit(self, fd: int, mark_fd: int, mark: bytes | None) -> None:
        self._check()
        with self._cv:
            if self._out:
                raise RuntimeError("an fsync is already out: take its result first")
            self._job = (fd, mark_fd, None if mark is None else bytes(mark))
            self._out, self._finished = True, False
            self._cv.notify_all()

    def run_job(self, fd: int, mark_fd: int, mark: bytes | None) -> tuple[int, int, float]:
        """(errno, stage, seconds) as the C thread reports them."""
        seconds = 0.0
        if fd >= 0:
            began = time.perf_counter()
            try:
                os.fdatasync(fd)
            except OSError as exc:
                return exc.errno or errno.EIO, 1, time.perf_counter() - began
            seconds = time.perf_counter() - began
        if mark is not None:
            try:
                done = 0
                while done < len(mark):
                    n = os.pwrite(mark_fd, mark[done:], done)
                    if n <= 0:
                        return errno.EIO, 2, seconds
                    done += n
            except OSError as exc:
                return exc.errno or errno.EIO, 2, seconds
        return 0, 0, seconds

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._job is None and not self._stop:
                    self._cv.wait()
                if self._job is None:
                    return
                job, self._job = self._job, None
            result = self.run_job(*job)
            with self._cv:
                self._result, self._finished = result, True
                self._cv.notify_all()
            try:
                os.eventfd_write(self._efd, 1)
            except OSError:
                pass

    def _take(self) -> tuple[int, int, float] | None:
        if not (self._out and self._finished):
            return None
        self._out = self._finished = False
        return self._result

    def _drain(self) -> None:
        try:
            os.eventfd_read(self._efd)
        except BlockingIOError:
            pass

    def poll(self) -> tuple[int, int, float] | None:
        self._check()
        self._drain()
        with self._cv:
            return self._take()

    def wait(self) -> tuple[int, int, float] | None:
        self._check()
        with self._cv:
            while self._out and not self._finished:
                self._cv.wait()
        self._drain()
        with self._cv:
            return self._take()

    def fileno(self) -> int:
        self._check()
        return self._efd

    def close(self) -> None:
        if self._pid == os.getpid() and self._thread.is_alive():
            with self._cv:
                self._stop = True
                self._cv.notify_all()
            self._thread.join()
        if self._efd >= 0:
            os.close(self._efd)
            self._efd = -1


def new_worker():
    """The fsync thread: the C one when built, else ``PyWorker``. Tests patch this."""
    return CWorker() if native() else PyWorker()


class NativeJob:
    """A ticket's run in the C thread, as the ticket's ``_job``: ``done()`` and ``result()`` like a pool's future."""

    __slots__ = ("runner", "ticket", "finished")

    def __init__(self, runner: "NativeFsync", ticket) -> None:
        self.runner = runner
        self.ticket = ticket
        self.finished = False

    def done(self) -> bool:
        return self.finished

    def result(self) -> None:
        """Until the job has ended (waiting for the thread when it runs); raises its OSError as the ticket's."""
        if not self.finished:
            self.runner.wait(self)
        if self.ticket.error is not None:
            raise self.ticket.error


class NativeFsync:
    """One C fsync thread and its eventfd. ``start`` hands it a ticket's job; ``collect`` (from the loop's reader
    callback on ``fileno()``) or ``wait`` (blocking) ends it and completes the ticket (``SyncTicket.native_done``).
    ``on_waited`` is called when ``wait`` ended a job, which the loop may not hear of through the eventfd (the wait
    may have drained it): the sync driver (relay/sync_driver.py) resolves its flight there."""

    def __init__(self, on_waited: Callable[[NativeJob], None] | None = None) -> None:
        self._worker = new_worker()
        self._job: NativeJob | None = None
        self._lock = threading.Lock()  # collect (the loop) and wait (a store operation, maybe another thread)
        self.on_waited = on_waited

    def fileno(self) -> int:
        return self._worker.fileno()

    def start(self, ticket, fd: int, mark_fd: int, mark: bytes | None) -> NativeJob:
        with self._lock:
            if self._job is not None:
                raise RuntimeError("a native fsync is already out")
            job = NativeJob(self, ticket)
            self._worker.submit(fd, mark_fd, mark)
            self._job = job
            return job

    def collect(self) -> NativeJob | None:
        """The job that has ended, completed; None when none has (or a wake-up left over from a ``wait``)."""
        with self._lock:
            result = self._worker.poll()
            if result is None:
                return None
            return self._end(result)

    def wait(self, job: NativeJob) -> None:
        with self._lock:
            if job.finished:
                return
            result = self._worker.wait()
            ended = self._end(result) if result is not None else None
        if ended is not None and self.on_waited is not None:
            self.on_waited(ended)

    def _end(self, result) -> NativeJob | None:
        job, self._job = self._job, None
        if job is None:
            return None
        errno_, stage, seconds = result
        job.finished = True
        job.ticket.native_done(errno_, stage, seconds)
        return job

    def close(self) -> None:
        """Stop the thread (a job out ends first; it is completed here)."""
        job = self._job
        if job is not None and not job.finished:
            self.wait(job)
        self._worker.close()
