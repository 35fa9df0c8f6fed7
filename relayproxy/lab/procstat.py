"""What Linux's /proc says about a process: CPU seconds (of a process, its tree, single threads, the machine), memory
(VmRSS, VmHWM, PSS) and children; the benchmarks' one copy of these readings.

Every reader answers None (or 0 for a sum) for a process that is gone rather than raising: a benchmark samples
processes that may end between two readings.
"""

from __future__ import annotations

import os
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def stat_fields(path: str) -> list[str] | None:
    """The fields of a /proc/.../stat file from field 3 (state) on (the command name, which may hold spaces, cut
    off): utime is [11], stime [12], cutime [13], cstime [14]. None when it cannot be read."""
    try:
        raw = Path(path).read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2:].split()


def cpu_seconds(pid: int | None) -> float | None:
    """user + sys CPU seconds of a process (its threads included) from /proc/<pid>/stat."""
    if pid is None:
        return None
    fields = stat_fields(f"/proc/{pid}/stat")
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def children(pid: int) -> list[int]:
    """The live children of pid, of all its threads (/proc/<pid>/task/*/children)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for task in tasks:
        try:
            out += [int(k) for k in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except OSError:
            continue
    return out


def descendants(pid: int) -> list[int]:
    """Every live descendant of pid (children of all its threads, recursively)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        for kid in children(todo.pop()):
            out.append(kid)
            todo.append(kid)
    return out


def tree_cpu(pid: int | None) -> float | None:
    """user+sys CPU seconds of pid and all its live descendants, plus what its reaped children used."""
    if pid is None:
        return None
    f = stat_fields(f"/proc/{pid}/stat")
    if f is None:
        return None
    total = int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])
    for k in descendants(pid):
        g = stat_fields(f"/proc/{k}/stat")
        if g is not None:
            total += int(g[11]) + int(g[12])
    return total / CLK_TCK


def pids_cpu(pids: list[int]) -> float:
    """``tree_cpu`` summed over processes (a gone one counts 0)."""
    return sum(tree_cpu(p) or 0.0 for p in pids)


def threads_cpu(pid: int, tids: list[int]) -> float:
    """CPU seconds of these threads of pid (threads gone by now count 0): the scheduler's on-CPU nanoseconds
    (/proc/<pid>/task/<tid>/schedstat) where the kernel has them, else user+sys ticks from .../stat."""
    total = 0.0
    for tid in tids:
        try:
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0]) / 1e9
            continue
        except (OSError, ValueError, IndexError):
            pass
        g = stat_fields(f"/proc/{pid}/task/{tid}/stat")
        if g is not None:
            total += (int(g[11]) + int(g[12])) / CLK_TCK
    return total


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, all cores (/proc/stat: total less idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    total = sum(fields) / CLK_TCK
    return total - (fields[3] + fields[4]) / CLK_TCK, total


def vm_kb(pid: int, key: str) -> int | None:
    """One kB figure of /proc/<pid>/status (``VmRSS``, ``VmHWM``, ...)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def proc_status_kb(pid: int) -> dict[str, int]:
    """{"VmHWM": kB, "VmRSS": kB} of /proc/<pid>/status (empty for a gone process)."""
    values = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                values[key] = int(rest.split()[0])
    except OSError:
        pass
    return values


def pss_kb(pid: int) -> int | None:
    """Proportional set size (shared pages divided among their users) from /proc/<pid>/smaps_rollup."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def tree_memory_kb(pid: int) -> dict:
    """VmRSS summed over pid and its descendants; VmHWM of each and their sum; PSS summed (processes alive now).
    For a relay with sender processes the RSS sum counts pages they share once per process; the PSS sum does not."""
    procs = [pid, *descendants(pid)]
    rss = [vm_kb(p, "VmRSS") or 0 for p in procs]
    hwm = [vm_kb(p, "VmHWM") or 0 for p in procs]
    pss = [pss_kb(p) for p in procs]
    return {"processes": len(procs), "rss_kb": sum(rss), "hwm_kb_sum": sum(hwm), "hwm_kb_max": max(hwm),
            "pss_kb": sum(pss) if None not in pss else None}


def fd_count(pid: int) -> int | None:
    """Open file descriptors of pid (/proc/<pid>/fd)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
