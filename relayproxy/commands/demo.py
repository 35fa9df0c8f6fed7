"""`relayproxy demo`: the master-crash-mid-transaction story (relayproxy.lab.story) shown live, then cleaned away.

A local MariaDB master, relayproxy, a replica through it and one direct, in a temporary folder; a live view of a
mixed workload, then the master killed mid-transaction, and which replica an HA controller may promote. Act 2
(unless --no-failover): the direct replica is promoted, relayproxy is repointed to it with SQL as an HA tool
repoints any replica, and the replica behind relayproxy goes on receiving the new master's writes. Act 3 (unless
--no-failover or --no-lossless; relayproxy.lab.semisync_story): a semi-sync master with relayproxy as its semi-sync
replica is killed under load; what promoting a lagging direct candidate as it is would lose, beside `relayproxy
promote` run as an HA tool runs it. Nothing is left running or on disk afterwards (unless --keep), also after
Ctrl-C, SIGTERM or an error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import TextIO

import pymysql

from ..lab.faultproxy import FaultProxyError
from ..lab.sandbox import SandboxError
from ..lab.semisync_story import LosslessResult, LosslessStory
from ..lab.story import CrashStory, FailoverResult, Snapshot, StoryError, StoryResult, promote_and_repoint
from ..log import configure_logging, get_logger

log = get_logger("relayproxy.demo")

INTRO = """\
relayproxy demo: what an HA controller sees when the master dies while a large transaction is half sent.
Its rule: a replica may be promoted once Read_Master_Log_Pos == Exec_Master_Log_Pos (it applied all it received).

  master --forwarder--> relayproxy --> replica "via relay"
  master --forwarder--> replica "direct"
  (the forwarders hold both links at the same byte of the big transaction, so the crash lands there every time)
"""

LEGEND = (
    "live view: master file:position, relay horizon file:position and Retrieved_Gtid_Set, "
    "replicas file:Read_Master_Log_Pos/Exec_Master_Log_Pos"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the temporary directory (datadirs, binlogs, relay files, logs) instead of removing it",
    )
    parser.add_argument(
        "--workload-seconds",
        type=float,
        default=10.0,
        metavar="S",
        help="how long the mixed workload runs (default 10)",
    )
    parser.add_argument(
        "--stuck-seconds",
        type=float,
        default=10.0,
        metavar="S",
        help="how long to watch the direct replica after the crash before calling it stuck (default 10)",
    )
    parser.add_argument(
        "--big-mb", type=int, default=16, metavar="MB", help="size of the transaction the crash cuts (default 16)"
    )
    parser.add_argument(
        "--no-live",
        action="store_true",
        help="print a status line every second instead of one line refreshed in place (always so when stdout "
        "is not a terminal)",
    )
    parser.add_argument(
        "--no-failover",
        action="store_true",
        help="stop after the crash (act 1); by default act 2 promotes the direct replica and repoints relayproxy, "
        "and act 3 kills a semi-sync master under load and runs relayproxy promote",
    )
    parser.add_argument(
        "--no-lossless",
        action="store_true",
        help="skip act 3 (a semi-sync master killed under load: a direct promotion's loss beside relayproxy promote)",
    )
    parser.add_argument(
        "--lossless-seconds", type=float, default=5.0, metavar="S",
        help="how long the 4 writers commit on the semi-sync master before it is killed in act 3 (default 5)",
    )
    parser.add_argument(
        "--lossless-delay-ms", type=int, default=250, metavar="MS",
        help="how long the act 3 candidate's link holds the master's stream, so that it lags (default 250)",
    )
    parser.add_argument(
        "--failover-writes", type=int, default=50, metavar="N",
        help="transactions written on the promoted master in act 2 (default 50)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the figures to FILE as JSON")
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show info logs (servers started and stopped; default: warnings only); the relay logs to "
        "relay/relay.log in the folder either way",
    )


class LiveView:
    """The status line: refreshed in place on a terminal, one line a second otherwise (and the first line of each
    new phase, so a short one such as the wait after a kill is never left out); narration goes between."""

    def __init__(self, out: TextIO, live: bool, every: float = 1.0) -> None:
        self.out = out
        self.live = live
        self.every = every
        self._showing = False
        self._last = 0.0
        self._phase: str | None = None  # the kind of the last line printed ("kill+1.2s" is of kind "kill")

    def show(self, snapshot: Snapshot) -> None:
        line = snapshot.line()
        if self.live:
            width = shutil.get_terminal_size((120, 24)).columns
            self.out.write("\r" + line[: max(width - 1, 20)] + "\x1b[K")
            self.out.flush()
            self._showing = True
        else:
            phase = snapshot.phase.split("+", 1)[0]
            if time.monotonic() - self._last >= self.every or phase != self._phase:
                self._last, self._phase = time.monotonic(), phase
                print(line, file=self.out, flush=True)

    def say(self, text: str) -> None:
        self.end_line()
        print(_wrap(text, "* ", "  "), file=self.out, flush=True)

    def end_line(self) -> None:
        if self._showing:
            self.out.write("\n")
            self.out.flush()
            self._showing = False


def _wrap(text: str, first: str = "  ", rest: str = "  ") -> str:
    width = min(shutil.get_terminal_size((110, 24)).columns, 110)
    # "kill -9" stays on one line: a NUL is no whitespace to textwrap.
    text = text.replace("kill -9", "kill\0-9")
    wrapped = textwrap.fill(text, width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False)
    return wrapped.replace("\0", " ")


class _Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP: handled like Ctrl-C, so every cleanup step runs."""


class _Stop:
    """Ctrl-C, SIGTERM and SIGHUP as exceptions that cannot be lost. Python ignores an exception raised while a
    ``__del__`` runs (PyMySQL's results have one), so a signal that lands there would be dropped and the demo would
    go on; the handler also records the signal, and ``check()`` (called at every progress line) raises it again."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def exception(self, signum: int) -> KeyboardInterrupt:
        return KeyboardInterrupt() if signum == signal.SIGINT else _Terminated(signal.Signals(signum).name)

    def handler(self, signum: int, _frame: object) -> None:
        self.signum = signum
        raise self.exception(signum)

    def check(self) -> None:
        if self.signum is not None:
            raise self.exception(self.signum)


def run(args: argparse.Namespace) -> int:
    problems = [
        f"{flag} must be {rule}, got {value}"
        for flag, value, ok, rule in (
            ("--workload-seconds", args.workload_seconds, args.workload_seconds >= 0, ">= 0"),
            ("--stuck-seconds", args.stuck_seconds, args.stuck_seconds > 0, "> 0"),
            ("--big-mb", args.big_mb, 1 <= args.big_mb <= 1024, "between 1 and 1024"),
            ("--failover-writes", args.failover_writes, 1 <= args.failover_writes <= 100_000, "between 1 and 100000"),
            ("--lossless-seconds", args.lossless_seconds, 0.5 <= args.lossless_seconds <= 600,
             "between 0.5 and 600"),
            ("--lossless-delay-ms", args.lossless_delay_ms, 0 <= args.lossless_delay_ms <= 5000, "between 0 and 5000"),
        )
        if not ok
    ]
    if problems:
        print("relayproxy demo: " + "; ".join(problems), file=sys.stderr)
        return 2
    if not args.verbose:
        # The story narrates on stdout; info logs (servers started, stopped) would only break the live line.
        configure_logging(fmt=getattr(args, "log_format", "auto"), level="warning")

    out = sys.stdout
    view = LiveView(out, live=out.isatty() and not args.no_live)
    workdir = Path(tempfile.mkdtemp(prefix="relayproxy-demo-"))
    print(INTRO, file=out)
    print(f"files in {workdir}", file=out)
    print(LEGEND, file=out, flush=True)
    stop = _Stop()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    for sig, handler in previous.items():
        if sig != signal.SIGINT or handler is signal.default_int_handler:  # an inherited SIG_IGN stays ignored
            signal.signal(sig, stop.handler)

    def observe(snapshot: Snapshot) -> None:
        stop.check()
        view.show(snapshot)

    def narrate(text: str) -> None:
        stop.check()
        view.say(text)

    story = CrashStory(workdir, observe=observe, narrate=narrate)
    lossless: LosslessStory | None = None
    result: StoryResult | None = None
    failover: FailoverResult | None = None
    lossless_result: LosslessResult | None = None
    code = 1
    try:
        with story:
            story.start()
            story.run_workload(args.workload_seconds)
            result = story.crash_mid_transaction(
                big_bytes=args.big_mb * 1024 * 1024,
                direct_cap=args.stuck_seconds,
                relay_cap=max(30.0, args.stuck_seconds),
            )
            view.end_line()
            code = _report(result, out)
            if code == 0 and not args.no_failover:
                failover = promote_and_repoint(story, writes=args.failover_writes)
                view.end_line()
                code = _report_failover(failover, out)
        view.end_line()
        if code == 0 and not args.no_failover and not args.no_lossless:
            # Acts 1 and 2's servers are stopped by now: act 3 has the machine to itself.
            lossless = LosslessStory(
                workdir / "act3", load_seconds=args.lossless_seconds, candidate_delay=args.lossless_delay_ms / 1000,
                observe=observe, narrate=narrate,
            )  # fmt: skip
            with lossless:
                lossless_result = lossless.run()
            view.end_line()
            code = _report_lossless(lossless_result, out)
    except KeyboardInterrupt as exc:
        view.end_line()
        terminated = isinstance(exc, _Terminated)
        why = f"terminated by {exc}" if terminated else "interrupted"
        print(f"relayproxy demo: {why}; stopping everything", file=sys.stderr)
        code = 143 if terminated else 130
    # AssertionError: the lab's waits in act 3 (relayproxy.lab.lossless) report a failure as one.
    except (StoryError, SandboxError, FaultProxyError, pymysql.MySQLError, OSError, AssertionError) as exc:
        view.end_line()
        print(f"relayproxy demo failed: {exc}", file=sys.stderr)
        if lossless is not None:
            with contextlib.suppress(Exception):
                print(f"act 3's topology:\n{lossless.trial.describe()}", file=sys.stderr)
        elif story.relay is not None:
            print(f"tail of the relay's log:\n{story.relay.log_tail(15)}", file=sys.stderr)
        code = 1
    finally:
        # A second Ctrl-C (or a SIGTERM) must not cut the cleanup short.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        try:
            code = _clean_up(story, lossless, workdir, args.keep, out, code)
            if args.json and result is not None:
                try:
                    figures = result.as_dict()
                    if failover is not None:
                        figures["failover"] = _failover_dict(failover)
                    if lossless_result is not None:
                        figures["lossless"] = lossless_result.as_dict()
                    Path(args.json).write_text(json.dumps(figures, indent=2, default=str) + "\n")
                except OSError as exc:
                    print(f"relayproxy demo: cannot write --json {args.json}: {exc.strerror}", file=sys.stderr)
                    code = code or 1
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: set outside Python
    return code


def _report(result: StoryResult, out: TextIO) -> int:
    direct, through = result.direct, result.through_relay

    def say(text: str = "") -> None:
        print(_wrap(text) if text else "", file=out)

    say()
    print("demo summary:", file=out)
    say(
        f"MariaDB {result.mariadb_version}; {result.workload_transactions} transactions of mixed workload in "
        f"{result.workload_seconds:.0f} s; then the master was killed (kill -9) while transaction "
        f"{result.big_transaction_gtid} ({result.big_transaction_bytes // (1024 * 1024)} MB) was half sent."
    )
    say()
    for line in result.summary_lines():
        print(line, file=out)
    say()
    if direct.stuck:
        say(
            "The direct replica received half of the transaction and can never finish it: Read stays ahead of Exec, "
            f"so the HA rule never lets the controller promote it ({direct.verdict()})."
        )
    else:
        say("The direct replica was not stuck this time (it satisfied the HA rule): unexpected.")
    if through.stuck:
        say("The replica through relayproxy did NOT reach Read == Exec: that breaks relayproxy's promise.")
        out.flush()
        return 1
    say(
        "relayproxy kept the incomplete transaction to itself: its Read_Master_Log_Pos stayed at the end of the last "
        f"complete transaction, and its replica was at Read == Exec {through.seconds_to_switch:.2f} s after the kill, "
        "so the HA controller may promote it at once."
    )
    out.flush()
    return 0


def _report_failover(result: FailoverResult, out: TextIO) -> int:
    print("\nact 2, after the failover:", file=out)
    for line in result.summary_lines():
        print(line, file=out)
    same = result.checksums_new_master == result.checksums_through_relay
    print(file=out)
    if not same:
        print(_wrap("The replica through relayproxy does NOT hold the new master's data: that breaks relayproxy's "
                    "promise."), file=out)
        out.flush()
        return 1
    print(_wrap("relayproxy followed the promoted master by GTID, with no preparation on it, and the replica behind "
                "it carried on: nothing lost, nothing repeated, no partial transaction (docs/failover.md)."),
          file=out)
    out.flush()
    return 0


def _report_lossless(result: LosslessResult, out: TextIO) -> int:
    print("\nact 3, a semi-sync master killed under load:", file=out)
    for line in result.summary_lines():
        print(line, file=out)
    print(file=out)
    broken = []
    if result.lost:
        broken.append(f"{result.lost} acknowledged commits are missing on the promoted candidate")
    if result.duplicate_rows or result.partial or result.errant:
        broken.append("the promoted candidate holds rows twice, partial transactions or GTIDs not from the old master")
    if not result.replica_caught_up:
        broken.append("the replica behind relayproxy did not receive the new master's writes")
    if broken:
        print(_wrap("; ".join(broken) + ": that breaks relayproxy's promise."), file=out)
        out.flush()
        return 1
    acked = len(result.acknowledged_ids)
    if result.direct_lost:
        direct = (f"Promoting the candidate as it was would have lost {result.direct_lost} of the {acked} commits "
                  "the master had acknowledged to its clients.")
    else:
        direct = ("This time the candidate's link kept up: it had every acknowledged commit, so a direct promotion "
                  "would have lost nothing either.")
    print(_wrap(f"{direct} The master acknowledged a commit only once relayproxy had it durable, so relayproxy held "
                "all of them; relayproxy promote put what the candidate lacked on it before making it writable: "
                f"0 of {acked} lost, and relayproxy and the replica behind it went on from the new master "
                "(docs/failover.md, \"Lossless promotion\")."), file=out)
    out.flush()
    return 0


def _failover_dict(result: FailoverResult) -> dict:
    return {
        "new_master_port": result.new_master_port,
        "promoted_at_gtid": result.promoted_at_gtid,
        "statements": result.statements,
        "writes": result.writes,
        "seconds_to_first": result.seconds_to_first,
        "seconds_to_all": result.seconds_to_all,
        "relay_files": result.relay_files,
        "checksums_equal": result.checksums_new_master == result.checksums_through_relay,
    }


def _clean_up(story: CrashStory, lossless: LosslessStory | None, workdir: Path, keep: bool, out: TextIO,
              code: int) -> int:
    """Stop whatever still runs, make sure no process of the demo is left, remove the folder unless kept."""
    for close in (story.close, lossless.close if lossless is not None else None):
        if close is None:
            continue
        try:
            close()
        except (StoryError, AssertionError) as exc:  # the lossless trial's TrialError is an AssertionError
            print(f"relayproxy demo: {exc}", file=sys.stderr)
            code = code or 1
    leftovers = processes_mentioning(workdir)
    for pid in leftovers:  # only processes whose command line names our own temporary folder: ours
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    if leftovers:
        print(f"relayproxy demo: processes left running were killed: {leftovers}", file=sys.stderr)
        code = code or 1
    if keep:
        print(f"kept {workdir} (relay files in {workdir / 'relay' / 'data'}; relayproxy inspect reads them)", file=out)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
        if workdir.exists():
            print(f"relayproxy demo: could not remove {workdir}", file=sys.stderr)
            code = code or 1
        else:
            print(f"stopped the servers and the relay, removed {workdir}; no process left behind", file=out)
    out.flush()
    return code


def processes_mentioning(path: Path) -> list[int]:
    """Ids of running processes (this one excepted) whose command line contains `path` (a /proc scan)."""
    needle = os.fsencode(str(path))
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline:
            found.append(int(entry.name))
    return sorted(found)

