"""An OS-crash simulator for one directory: what survives a power cut is what was fsynced, and not more than that.

``CrashFS(directory)`` wraps the ``os`` calls a store uses to change files (``open`` with ``O_CREAT``/``O_TRUNC``,
``write``, ``pwrite``, ``ftruncate``, ``fsync``, ``fdatasync``, ``replace``, ``rename``, ``unlink``, ``close``) for
the files of that one directory; everything else passes through untouched. It keeps a model of the disk beside the
real files:

- per file (inode), its content as of its last ``fsync``/``fdatasync`` and the writes and truncations made since;
- for the directory, its entries (name -> inode) as of the last ``fsync`` of the directory itself, and the entry
  operations since (creations, renames, unlinks): a new or renamed file whose directory was not fsynced may vanish
  or come back under its old name.

``crash_at=n`` makes the n-th of those calls raise ``SimulatedCrash`` (a BaseException, so no ``except OSError``
in the code under test swallows it) before it does anything; every later call raises too (the process is dead).
``materialize(mode, rng)`` then rewrites the real directory as the disk could be after the OS went down:

- ``"drop"``: nothing unsynced survives: each file rolled back to its last synced content, the directory to its
  last synced entries;
- ``"keep"``: everything reached the disk (the page cache was written back just in time);
- ``"random"``: each file independently keeps a random prefix of its unsynced writes, the last one possibly torn,
  or all or none of them; the directory keeps a random prefix of its entry operations. Writeback order between
  files is free in a real kernel, so a small file written after a big one may survive while the big one does not.

Files present when the layer is installed count as synced (install it on an empty or cleanly closed directory).
The directory itself must exist before (``mkdir`` is not modelled). Used by tests (tests/relay/test_crash_simulation.py);
the runtime never imports it.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path

WRAPPED = ("open", "write", "pwrite", "ftruncate", "fsync", "fdatasync", "replace", "rename", "unlink", "close")


class SimulatedCrash(BaseException):
    """The simulated OS went down at this call: nothing after it happened."""


@dataclass(eq=False)
class Inode:
    """One file of the model: its synced content and the changes since (("write", offset, data) or ("trunc", n))."""

    synced: bytes
    ops: list = field(default_factory=list)

    def content(self, keep: int | None = None, torn: int | None = None) -> bytes:
        """The content with the first ``keep`` unsynced changes applied (all when None); ``torn`` cuts the last
        applied write to that many bytes."""
        data = bytearray(self.synced)
        ops = self.ops if keep is None else self.ops[:keep]
        for i, op in enumerate(ops):
            if op[0] == "trunc":
                del data[op[1]:]
                data.extend(bytes(max(op[1] - len(data), 0)))
                continue
            _, offset, chunk = op
            if torn is not None and i == len(ops) - 1:
                chunk = chunk[:torn]
            if offset > len(data):
                data.extend(bytes(offset - len(data)))
            data[offset:offset + len(chunk)] = chunk
        return bytes(data)


class CrashFS:
    """The fault layer; ``install()`` patches ``os``, ``uninstall()`` restores it (also a context manager)."""

    def __init__(self, directory: str | os.PathLike, *, crash_at: int | None = None):
        self.root = Path(directory).resolve()
        self.crash_at = crash_at
        self.calls = 0  # calls counted toward crash_at
        self.crashed = False
        self.crash_call: str | None = None  # what the crashing call was, e.g. "fdatasync relayproxy.durable"
        self.log: list[str] = []  # every counted call, in order (for reports)
        self._real = {name: getattr(os, name) for name in WRAPPED}
        self._fds: dict[int, Inode | str] = {}  # fd -> inode, or "dir" for the directory itself
        self.names: dict[str, Inode] = {}  # the directory as it is now
        for entry in os.scandir(self.root):
            if entry.is_file(follow_symlinks=False):
                self.names[entry.name] = Inode(Path(entry.path).read_bytes())
        self.synced_names: dict[str, Inode] = dict(self.names)  # the directory as of its last fsync
        self.dir_ops: list[tuple] = []  # ("link", name, inode) / ("unlink", name) since the last directory fsync
        self._installed = False

    # -- installing ------------------------------------------------------------------------------------------------
    def install(self) -> "CrashFS":
        for name in WRAPPED:
            setattr(os, name, getattr(self, "_" + name))
        self._installed = True
        return self

    def uninstall(self) -> None:
        if self._installed:
            for name, real in self._real.items():
                setattr(os, name, real)
            self._installed = False

    def __enter__(self) -> "CrashFS":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()

    # -- helpers ---------------------------------------------------------------------------------------------------
    def _name(self, path, dir_fd=None) -> str | None:
        """The entry name when ``path`` is a file directly in the directory, "." for the directory, else None."""
        if dir_fd is not None or isinstance(path, int):
            return None
        p = Path(os.fsdecode(os.fspath(path)))
        p = p if p.is_absolute() else Path.cwd() / p
        parent = Path(os.path.abspath(p.parent))
        if Path(os.path.abspath(p)) == self.root:
            return "."
        return p.name if parent == self.root else None

    def _count(self, what: str) -> None:
        if self.crashed:
            raise SimulatedCrash(f"after the crash: {what}")
        self.calls += 1
        self.log.append(what)
        if self.crash_at is not None and self.calls >= self.crash_at:
            self.crashed = True
            self.crash_call = what
            raise SimulatedCrash(f"crash at call {self.calls}: {what}")

    def _fd_label(self, fd: int) -> str:
        target = self._fds.get(fd)
        if target == "dir":
            return "<dir>"
        return next((n for n, inode in self.names.items() if inode is target), "<unlinked>")

    # -- the wrapped calls -----------------------------------------------------------------------------------------
    def _open(self, path, flags, mode=0o777, *, dir_fd=None):
        name = self._name(path, dir_fd)
        if name is None:
            return self._real["open"](path, flags, mode, dir_fd=dir_fd)
        if name == ".":
            fd = self._real["open"](path, flags, mode)
            self._fds[fd] = "dir"
            return fd
        creates = bool(flags & os.O_CREAT) and name not in self.names
        truncates = bool(flags & os.O_TRUNC) and name in self.names and bool(flags & (os.O_WRONLY | os.O_RDWR))
        if creates or truncates:
            self._count(f"open{'+create' if creates else '+trunc'} {name}")
        fd = self._real["open"](path, flags, mode)
        if creates:
            inode = Inode(b"")
            self.names[name] = inode
            self.dir_ops.append(("link", name, inode))
        elif name in self.names:
            inode = self.names[name]
            if truncates:
                inode.ops.append(("trunc", 0))
        else:  # opened without O_CREAT and missing: the real open raised already
            return fd
        self._fds[fd] = inode
        return fd

    def _write(self, fd, data):
        inode = self._fds.get(fd)
        if not isinstance(inode, Inode):
            return self._real["write"](fd, data)
        self._count(f"write {self._fd_label(fd)}")
        offset = os.lseek(fd, 0, os.SEEK_CUR)
        n = self._real["write"](fd, data)
        inode.ops.append(("write", offset, bytes(memoryview(data)[:n])))
        return n

    def _pwrite(self, fd, data, offset):
        inode = self._fds.get(fd)
        if not isinstance(inode, Inode):
            return self._real["pwrite"](fd, data, offset)
        self._count(f"pwrite {self._fd_label(fd)}@{offset}+{len(data)}")
        n = self._real["pwrite"](fd, data, offset)
        inode.ops.append(("write", offset, bytes(memoryview(data)[:n])))
        return n

    def _ftruncate(self, fd, length):
        inode = self._fds.get(fd)
        if not isinstance(inode, Inode):
            return self._real["ftruncate"](fd, length)
        self._count(f"ftruncate {self._fd_label(fd)} {length}")
        self._real["ftruncate"](fd, length)
        inode.ops.append(("trunc", length))

    def _sync(self, which: str, fd) -> None:
        target = self._fds.get(fd)
        if target is None:
            return self._real[which](fd)
        self._count(f"{which} {self._fd_label(fd)}")
        self._real[which](fd)
        if target == "dir":
            self.synced_names = dict(self.names)
            self.dir_ops.clear()
        else:
            with open(f"/proc/self/fd/{fd}", "rb") as f:  # also for a write-only descriptor
                target.synced = f.read()
            target.ops.clear()

    def _fsync(self, fd):
        return self._sync("fsync", fd)

    def _fdatasync(self, fd):
        return self._sync("fdatasync", fd)

    def _move(self, which: str, src, dst, **kw):
        a, b = self._name(src, kw.get("src_dir_fd")), self._name(dst, kw.get("dst_dir_fd"))
        if a is None and b is None:
            return self._real[which](src, dst, **kw)
        if a is None or b is None or "." in (a, b):
            raise AssertionError(f"CrashFS models renames inside {self.root} only: {src} -> {dst}")
        self._count(f"{which} {a} -> {b}")
        self._real[which](src, dst, **kw)
        inode = self.names.pop(a)
        self.names[b] = inode
        self.dir_ops.append(("unlink", a))
        self.dir_ops.append(("link", b, inode))

    def _replace(self, src, dst, **kw):
        return self._move("replace", src, dst, **kw)

    def _rename(self, src, dst, **kw):
        return self._move("rename", src, dst, **kw)

    def _unlink(self, path, *, dir_fd=None):
        name = self._name(path, dir_fd)
        if name is None or name == ".":
            return self._real["unlink"](path, dir_fd=dir_fd)
        self._count(f"unlink {name}")
        self._real["unlink"](path)
        self.names.pop(name, None)
        self.dir_ops.append(("unlink", name))

    def _close(self, fd):
        self._fds.pop(fd, None)
        return self._real["close"](fd)

    # -- the crash -------------------------------------------------------------------------------------------------
    def close_all(self) -> None:
        """Close every descriptor still open on the directory (the dead process's)."""
        for fd in list(self._fds):
            try:
                self._real["close"](fd)
            except OSError:
                pass
        self._fds.clear()

    def disk_after_crash(self, mode: str, rng: random.Random | None = None) -> dict[str, bytes]:
        """What the directory holds after the OS went down: name -> content (see the module doc for ``mode``)."""
        if mode not in ("drop", "keep", "random"):
            raise ValueError(f"unknown crash mode {mode!r}")
        if mode == "random" and rng is None:
            raise ValueError("mode 'random' needs an rng")
        if mode == "drop":
            entries = dict(self.synced_names)
        elif mode == "keep":
            entries = dict(self.names)
        else:
            entries = dict(self.synced_names)
            for op in self.dir_ops[: rng.randint(0, len(self.dir_ops))]:
                if op[0] == "link":
                    entries[op[1]] = op[2]
                else:
                    entries.pop(op[1], None)
        disk = {}
        for name, inode in entries.items():
            if mode == "drop":
                disk[name] = inode.content(0)
            elif mode == "keep" or not inode.ops:
                disk[name] = inode.content()
            else:
                style = rng.random()
                if style < 0.3:
                    disk[name] = inode.content(0)
                elif style < 0.6:
                    disk[name] = inode.content()
                else:
                    keep = rng.randint(1, len(inode.ops))
                    last = inode.ops[keep - 1]
                    torn = rng.randint(0, len(last[2])) if last[0] == "write" and rng.random() < 0.5 else None
                    disk[name] = inode.content(keep, torn)
        return disk

    def materialize(self, mode: str, rng: random.Random | None = None) -> dict[str, bytes]:
        """Close the dead process's descriptors and rewrite the real directory as ``disk_after_crash`` says (with
        the real ``os`` calls); returns that content."""
        disk = self.disk_after_crash(mode, rng)
        self.close_all()
        unlink = self._real["unlink"]
        for entry in os.scandir(self.root):
            if entry.is_file(follow_symlinks=False):
                unlink(entry.path)
        for name, content in disk.items():
            (self.root / name).write_bytes(content)
        return disk
