"""The fsync thread (relay/fsyncer.py): the C worker (``_fsync.c``) and ``PyWorker`` keep one contract, and a sync
ticket run there fails the store, publishes and is waited for as one run in the thread pool is."""

from __future__ import annotations

import os
import select

import pytest

from relayproxy.relay import fsyncer
from relayproxy.relay.durable import encode_durable_mark, read_durable_mark
from relayproxy.relay.errors import RelayStoreFailed

from ..support.fakemaster import split_events
from .test_relay_store import NO_AUTO_SYNC, Feeder, fresh_store, mysql_image

WORKERS = [pytest.param(fsyncer.PyWorker, id="python")]
if fsyncer.CWorker is not None:
    WORKERS.append(pytest.param(fsyncer.CWorker, id="c"))
elif os.environ.get("CI"):
    WORKERS.append(pytest.param(None, id="c", marks=pytest.mark.xfail(strict=True, reason="C extension not built")))


@pytest.fixture(params=WORKERS)
def worker(request):
    if request.param is None:
        pytest.fail("relayproxy.relay._fsync is not built (make setup builds it; a compiler is needed)")
    w = request.param()
    yield w
    w.close()


@pytest.fixture
def files(tmp_path):
    data = os.open(tmp_path / "data", os.O_RDWR | os.O_CREAT, 0o644)
    mark = os.open(tmp_path / "mark", os.O_RDWR | os.O_CREAT, 0o644)
    yield data, mark, tmp_path
    os.close(data)
    os.close(mark)


def readable(fd: int, timeout: float = 10.0) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


def test_a_job_runs_signals_and_is_taken_once(worker, files):
    data, mark, tmp_path = files
    assert worker.poll() is None and worker.wait() is None  # no job out
    os.write(data, b"x" * 100)
    worker.submit(data, mark, b"the mark")
    assert readable(worker.fileno())
    err, stage, seconds = worker.poll()
    assert (err, stage) == (0, 0) and seconds >= 0
    assert (tmp_path / "mark").read_bytes() == b"the mark"
    assert worker.poll() is None  # taken; the eventfd is drained
    assert not readable(worker.fileno(), 0.05)


def test_one_job_at_a_time_and_wait_takes_it(worker, files):
    data, mark, _ = files
    worker.submit(data, -1, None)
    with pytest.raises(RuntimeError, match="already out"):
        worker.submit(data, -1, None)
    assert worker.wait()[:2] == (0, 0)
    # a wake-up left over from a job wait() took is harmless: poll drains it and says None
    readable(worker.fileno(), 0.2)
    assert worker.poll() is None
    worker.submit(-1, mark, b"m")  # fd < 0: no fdatasync, only the mark
    assert worker.wait() == (0, 0, 0.0)


def test_errors_name_their_stage(worker, files, tmp_path):
    data, mark, _ = files
    closed = os.open(tmp_path / "gone", os.O_RDWR | os.O_CREAT)
    os.close(closed)
    worker.submit(closed, mark, b"m")
    err, stage, _ = worker.wait()
    assert (err, stage) == (9, 1)  # EBADF in the fdatasync: the mark is not written
    worker.submit(data, closed, b"m")
    err, stage, _ = worker.wait()
    assert (err, stage) == (9, 2)


def test_closed_and_forked_workers_refuse(worker, files):
    data, _, _ = files
    pid = os.fork()
    if pid == 0:  # the child has the object but not the thread
        try:
            worker.submit(data, -1, None)
            code = 1
        except ValueError:
            code = 0
        worker.close()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    worker.submit(data, -1, None)
    assert worker.wait()[:2] == (0, 0)  # the parent's thread still works
    worker.close()
    worker.close()
    with pytest.raises(ValueError, match="closed"):
        worker.poll()


@pytest.mark.parametrize("kind", ["python", "c"])
def test_a_ticket_in_the_fsync_thread_publishes_and_fails_as_in_the_pool(tmp_path, monkeypatch, kind):
    if kind == "c" and fsyncer.CWorker is None:
        pytest.fail("relayproxy.relay._fsync is not built")
    monkeypatch.setattr(fsyncer, "new_worker", fsyncer.CWorker if kind == "c" else fsyncer.PyWorker)
    image = mysql_image("binlog.000002", groups=6)
    events = split_events(image)
    store = fresh_store(tmp_path, sync=NO_AUTO_SYNC)
    relay_dir = tmp_path / "relay"
    feeder = Feeder(store, sync_each_event=False)
    waited = []
    runner = fsyncer.NativeFsync(on_waited=waited.append)
    try:
        for offset, ev in events[:9]:
            feeder.feed(offset, ev)
        covered = store.boundary_end
        ticket = store.begin_sync()
        assert ticket.checkpoint is None and ticket.moves
        ticket.submit_native(runner)
        assert readable(runner.fileno())
        job = runner.collect()
        assert job is ticket._job and job.done() and ticket.durable and not waited
        assert store.complete_sync(ticket)
        assert store.horizon.snapshot().coordinates == ("binlog.000001", covered)
        mark, problem = read_durable_mark(relay_dir)
        assert problem is None and (mark.file, mark.position) == ("binlog.000001", covered)
        assert (relay_dir / "relayproxy.durable").read_bytes() == encode_durable_mark("binlog.000001", covered)

        # make_durable (and wait) on a ticket out in the thread wait for that run; on_waited says so
        for offset, ev in events[9:13]:
            feeder.feed(offset, ev)
        ticket = store.begin_sync()
        ticket.submit_native(runner)
        ticket.make_durable()
        assert ticket.durable and waited == [ticket._job]
        readable(runner.fileno(), 0.2)
        assert runner.collect() is None  # its eventfd wake-up: already taken
        store.complete_sync(ticket)

        # a failed fdatasync fails the store at once, as in the pool
        for offset, ev in events[13:-1]:
            feeder.feed(offset, ev)
        ticket = store.begin_sync()
        assert ticket.needs_fsync
        ticket._fd = 10_000  # not open: EBADF
        ticket.submit_native(runner)
        ticket.wait()
        assert isinstance(ticket.error, OSError) and "fdatasync" in str(ticket.error)
        with pytest.raises(RelayStoreFailed):
            store.complete_sync(ticket)
        assert store.failure is not None
    finally:
        runner.close()
        store.close()
