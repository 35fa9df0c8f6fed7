"""Lossless promotion, randomized: a semi-sync master killed under load, `relayproxy promote` through the relay vs
promoting the lagging direct replica as it is, side by side in every trial (``relayproxy.lab.lossless.Trial`` has
the topology and the kinds). Every ``--fallback-every``-th trial lets the master fall back to async: the documented
hole, counted apart. Exit code 1 when a trial of a lossless kind lost, duplicated or made errant anything, or could
not be run to its end.

    .venv/bin/python benchmarks/lossless_trials.py                      # 200 trials, seed 1
    .venv/bin/python benchmarks/lossless_trials.py --trials 12 --seed 7 --out /tmp/lt/lossless_trials.md
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as a file: the repository root on sys.path (benchmarks/__init__.py)
    import _bootstrap  # noqa: F401

from benchmarks import benchinfo  # noqa: E402
from benchmarks.common import RESULTS_DIR, add_report_options, logger, percentile, results_document  # noqa: E402
from benchmarks.common import save_figure  # noqa: E402
from benchmarks.relay_bench import report_of  # noqa: E402
from relayproxy.lab.lossless import (  # noqa: E402
    KINDS,
    LONG_TIMEOUT_MS,
    SHORT_TIMEOUT_MS,
    TrialResult,
    TrialSpec,
    run_trial,
    trial_kinds,
    trial_seeds,
)
from relayproxy.lab.sandbox import TEMPLATE_ENV  # noqa: E402


log = logger("lossless_trials")


def run_trials(count: int, seed: int, *, fallback_every: int, workdir: Path, progress=log) -> list[dict]:
    """Run the trials; one dict per trial (TrialResult.as_dict, or the error that stopped it)."""
    rows = []
    kinds = trial_kinds(count, fallback_every=fallback_every)
    for i, (trial_seed, kind) in enumerate(zip(trial_seeds(seed, count), kinds)):
        spec = TrialSpec.draw(trial_seed, kind)
        trial_dir = workdir / f"trial{i + 1:03d}-{trial_seed}"
        try:
            result = run_trial(trial_dir, spec)
        except Exception as exc:  # noqa: BLE001 - recorded; a finding for promote, or for the lab
            result = TrialResult(spec, error=f"{type(exc).__name__}: {exc}"[:6000])
            progress(f"trial {i + 1}/{count} (seed {trial_seed}, {kind}) FAILED TO RUN; kept {trial_dir}: "
                     f"{result.error[:600]}")
        else:
            verdict = "" if result.ok else f" -- NOT OK, kept {trial_dir}"
            progress(f"trial {i + 1}/{count}: {result.summary()}{verdict}")
        row = result.as_dict()
        row["index"] = i + 1
        rows.append(row)
    return rows


# kind_summary's sums over the trials run to their end: of a trial's own counts, and of what else is added up
COUNTED = ("acked", "acked_rows", "lost", "duplicate_rows", "partial", "direct_lost", "unacked_returned",
           "unacked_lost")
SUMMED = (
    ("errant", lambda r: len(r["errant"])), ("relay_dropped", lambda r: len(r.get("relay_dropped", []))),
    ("direct_trials", lambda r: r["direct_lost"] > 0), ("unacked_trials", lambda r: r["unacked_lost"] > 0),
    ("direct_unacked_lost", lambda r: r.get("direct_unacked_lost", 0)), ("fell_back", lambda r: bool(r["fell_back"])),
    ("promote_killed", lambda r: any(p.get("killed") for p in r["promote_runs"])),
    ("promote_reruns", lambda r: len(r["promote_runs"]) - 1),
    ("candidate_ahead", lambda r: bool(r["candidate_ahead"])),
    ("candidate_extra", lambda r: bool(r.get("candidate_extra"))),
    ("replica_checked", lambda r: r["replica_caught_up"] is not None),
    ("replica_ok", lambda r: r["replica_caught_up"] is True),
)


def kind_summary(rows: list[dict], kind: str) -> dict:
    mine = [r for r in rows if r["spec"]["kind"] == kind]
    done = [r for r in mine if r["error"] is None]
    times = [r["kill_to_writable"] for r in done]
    return {
        "kind": kind, "trials": len(mine), "errors": len(mine) - len(done),
        **{key: sum(r[key] for r in done) for key in COUNTED},
        **{key: sum(of(r) for r in done) for key, of in SUMMED},
        "direct_max": max((r["direct_lost"] for r in done), default=0),
        "writable_median": benchinfo.median_range(times)[0] if times else None,
        "writable_p95": percentile(times, 95, method="nearest-rank") if times else None,
        "writable_max": max(times, default=None),
    }


def one_line(error: str) -> str:
    """An error's first line and the last line that names an error (a relay's log tail follows the first)."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    named = []
    for line in lines[1:]:
        if line.startswith("{"):  # a relay's JSON log record: its error, else its event
            with contextlib.suppress(ValueError, AttributeError):
                record = json.loads(line)
                line = f"relay log: {record.get('event')}: {record.get('error', '')}"
        if "Error" in line or "error" in line:
            named.append(line)
    text = lines[0] if lines else ""
    if named:
        text += " ... " + named[-1]
    return text.replace("|", "/")[:700]


def step_table(rows: list[dict]) -> list[str]:
    """Median / p95 / max seconds of each step `relayproxy promote --json` reported, over the runs that exited 0."""
    steps: dict[str, list[float]] = {}
    for r in rows:
        for step in (r.get("promote_report") or {}).get("steps") or []:
            steps.setdefault(step["step"], []).append(float(step["seconds"]))
    if not steps:
        return []
    out = ["| step (as `relayproxy promote --json` names it) | runs | median, s | p95, s | max, s |",
           "|---|---:|---:|---:|---:|"]
    for name, values in steps.items():
        out.append(f"| {name} | {len(values)} | {benchinfo.median_range(values)[0]:.3f} "
                   f"| {percentile(values, 95, method='nearest-rank'):.3f} | {max(values):.3f} |")
    return out


def fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def write_markdown(path: Path, report: dict) -> None:
    rows = report["trials"]
    summaries = [kind_summary(rows, k) for k in KINDS if any(r["spec"]["kind"] == k for r in rows)]
    lossless = [s for s in summaries if s["kind"] != "fallback"]
    bad = [r for r in rows if r["spec"]["kind"] != "fallback" and not r["ok"]]
    bad_fallback = [r for r in rows if r["spec"]["kind"] == "fallback" and not r["ok"]]
    t = {key: sum(s[key] for s in lossless) for key in ("lost", "acked", "trials", "duplicate_rows", "errant",
                                                         "relay_dropped", "direct_lost", "direct_trials")}
    out = [
        f"**Through the relay: {t['lost']} acknowledged commits lost of {t['acked']:,} in {t['trials']} trials of "
        f"the lossless kinds, {t['duplicate_rows']} rows applied twice, {t['errant']} errant GTIDs, "
        f"{t['relay_dropped']} relays holding a GTID the promoted master lacked, {len(bad)} trial(s) not OK.** "
        f"Promoting the lagging direct candidate as it was would have lost {t['direct_lost']:,} acknowledged "
        f"commits, in {t['direct_trials']} of those trials.",
        "",
        "An acknowledged commit is a transaction whose COMMIT returned on the semi-sync master "
        f"(`rpl_semi_sync_master_wait_point=AFTER_SYNC`, `rpl_semi_sync_master_timeout={LONG_TIMEOUT_MS}` ms: "
        "longer than any trial, so it returned only once a relay had it durable; each lossless trial also checks "
        "that the master's `Rpl_semi_sync_master_no_tx` did not grow). *Lost via the relay* counts them missing on "
        "the master `relayproxy promote` made; *lost promoting as-is* counts those the candidate lacked once it had "
        "applied everything it received (its link dropped at the kill, as a dead master's host leaves it), measured "
        "in the same trial just before promote ran. *kill -> writable*: from the master's SIGKILL until the "
        "candidate's `@@read_only` reads 0 (polled every 10 ms), less the time the direct snapshot took.",
        "",
        "| kind | trials | acked commits (rows) | lost via relay | rows applied twice | partial trx | errant GTIDs "
        "| lost promoting as-is: sum / max / trials with loss | kill -> writable median / p95 / max, s "
        "| promote runs after the first | new writes reached T |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        errors = f" ({s['errors']} not run to the end)" if s["errors"] else ""
        out.append(
            f"| {s['kind']} | {s['trials']}{errors} "
            f"| {s['acked']:,} ({s['acked_rows']:,}) | {s['lost']} | {s['duplicate_rows']} | {s['partial']} "
            f"| {s['errant']} | {s['direct_lost']:,} / {s['direct_max']:,} / {s['direct_trials']} "
            f"| {fmt_s(s['writable_median'])} / {fmt_s(s['writable_p95'])} / {fmt_s(s['writable_max'])} "
            f"| {s['promote_reruns']} | {s['replica_ok']} of {s['replica_checked']} |")
    out += ["",
            "- *master*: the master killed. *relay-kill*: a relay also killed with SIGKILL at a random moment from "
            "during the load to 1.5 s after the master's kill (promote runs from ~0.3-1 s after it: the relay can be "
            "down when promote starts, or die under it), restarted from its directory 0-1 s later. "
            "*promote-kill*: the first `relayproxy promote` killed with SIGKILL 0.25-0.65 s after it started "
            f"({sum(s['promote_killed'] for s in summaries)} kills landed while it ran), then run again. "
            "*fallback*: below.",
            f"- The candidate had received more than every relay when the master died in "
            f"{sum(s['candidate_ahead'] for s in summaries)} trials (the relays acknowledge after their fsync; the "
            "candidate's async stream can be ahead when its delay is small, or while a relay is down): promote must "
            "then lose nothing and keep what the candidate has. `relayproxy promote` reported such GTIDs (the dead "
            "master's own transactions, on the candidate, in no relay: `unrelayed`, or `errant` from a promote that "
            f"did not tell them apart) in {sum(s['candidate_extra'] for s in summaries)} trials; they are not counted "
            "in the *errant GTIDs* column (GTIDs on the promoted master with another server_id than the dead "
            "master's).", ""]
    fb = next((s for s in summaries if s["kind"] == "fallback"), None)
    if fb:
        out += [
            "## The documented hole: semi-sync fell back to async", "",
            f"In {fb['trials']} fallback trials the master ran with `rpl_semi_sync_master_timeout={SHORT_TIMEOUT_MS}` "
            "ms and the relays' links were paused during the load (a stalled or partitioned relay): the master "
            f"waited {SHORT_TIMEOUT_MS} ms, switched to asynchronous replication (`Rpl_semi_sync_master_status` OFF in "
            f"{fb['fell_back']} of the {fb['trials'] - fb['errors']} run to the end) and went on returning COMMITs no "
            "relay had acknowledged. Those are counted apart and are not a promise the relay makes:", "",
            "| | trials | commits | lost via relay | lost promoting the candidate as-is |", "|---|---:|---:|---:|---:|",
            f"| returned before the pause (acknowledged) | {fb['trials']} | {fb['acked']:,} | {fb['lost']} "
            f"| {fb['direct_lost']:,} |",
            f"| returned after the pause (unacknowledged once the master fell back) | {fb['trials']} "
            f"| {fb['unacked_returned']:,} | {fb['unacked_lost']:,} (in {fb['unacked_trials']} trials) "
            f"| {fb['direct_unacked_lost']:,} |", "",
            "Some of the later commits survive anyway: those returned before the timeout expired were acknowledged "
            "late, and the candidate's own async stream may hold others (promote keeps what the candidate has). "
            "Monitoring `Rpl_semi_sync_master_status` (or running with a timeout the application can afford to "
            "wait) is what closes this hole; the relay cannot.", ""]
    if bad or bad_fallback:
        out += ["## Trials not OK", ""]
        for r in bad + bad_fallback:
            s = r["spec"]
            out += [f"- trial {r['index']}, seed {s['seed']}, {s['kind']}: lost {r['lost']} {r['lost_tids'][:10]}, "
                    f"duplicate rows {r['duplicate_rows']}, partial {r['partial']}, errant {r['errant']}, "
                    f"relay held more {r.get('relay_dropped')}, "
                    f"replica {r['replica_caught_up']}, promote runs {json.dumps(r['promote_runs'])[:1500]}"
                    + (f"; error: {one_line(r['error'])}" if r["error"] else "")]
        out.append("")
    steps = step_table([r for r in rows if r["error"] is None])
    if steps:
        out += ["## Where promote's time goes", "",
                "The steps of the run that finished each trial (its `--json` document; a rerun after a kill or an "
                "exit of 4 finds some steps done). The Python start-up of the command (~0.2-0.3 s here) is in no "
                "step.", "", *steps, ""]
    out += ["## Every trial", "",
            "`TrialSpec.draw(seed, kind)` (relayproxy/lab/lossless.py) gives a trial's choices again from its seed. "
            "delay: the candidate link's hold per chunk; load: seconds of writes before the kill; big: chance that "
            "a transaction is 1-3 MB; relay kill: seconds relative to the master's kill (negative: before); promote "
            "exits: each run's exit code (k: killed).", "",
            "| # | seed | kind | relays | delay, s | T | load, s | big | acked | in flight | lost via relay "
            "| as-is lost | candidate ahead | kill -> writable, s | promote exits | event | trial, s |",
            "|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---|---|---:|"]
    for r in rows:
        s = r["spec"]
        event = ""
        if s["kind"] == "relay-kill":
            at = r["relay_killed_at"] if r["relay_killed_at"] is not None else s["relay_kill_at"]
            event = f"relay{s['killed_relay'] + 1} killed at {at:+.2f} s, down {s['relay_down']:.2f} s"
        elif s["kind"] == "promote-kill":
            left = next((p.get("state_after_kill") for p in r["promote_runs"] if p.get("killed")), None)
            event = (f"promote killed after {s['promote_kill_after']:.2f} s" + (f", left: {left}" if left else "")
                     if left or any(p.get("killed") for p in r["promote_runs"]) else
                     f"promote done before its kill at {s['promote_kill_after']:.2f} s")
        elif s["kind"] == "fallback":
            event = (f"paused at {s['pause_at']:.2f} s; fell back {'yes' if r['fell_back'] else 'no'}; unacked "
                     f"{r['unacked_returned']}, lost {r['unacked_lost']}")
        exits = ",".join("k" if p.get("killed") else str(p.get("exit_code")) for p in r["promote_runs"])
        head = (f"| {r['index']} | {s['seed']} | {s['kind']} | {s['relays']} | {s['candidate_delay']:.3f} "
                f"| {'yes' if s['replica'] else 'no'} | {s['load_seconds']:.2f} | {s['big_chance']} | ")
        if r["error"]:
            out.append(f"{head}not run to the end: {r['error'][:200]!r} | | | | | | {exits} | {event} | |")
        else:
            out.append(f"{head}{r['acked']} | {r['in_flight']} | {r['lost']} | {r['direct_lost']} "
                       f"| {'yes' if r['candidate_ahead'] else ''} | {r['kill_to_writable']:.2f} | {exits} | {event} "
                       f"| {r['total_seconds']:.1f} |")
    trial_seconds = [r["total_seconds"] for r in rows if r["error"] is None]
    out += ["",
            f"Whole run: {report['run_seconds']:.0f} s for {len(rows)} trials (a trial, set-up to tear-down: median "
            f"{benchinfo.median_range(trial_seconds)[0] if trial_seconds else 0:.1f} s, max "
            f"{max(trial_seconds, default=0):.1f} s).", "",
            "Settings: every server MariaDB, binlog_format=ROW, GTID strict mode; the master and the candidate with "
            "binlog basename mysql-bin, the candidate with log_slave_updates and read_only=1; the relays "
            "`relayproxy run --semi-sync on --gtid-mode mariadb --listen ... --users repl:...,admin:...:admin` with "
            "the test harness's `--heartbeat-period 0.5 --reconnect-max-delay 0.5`; promote as "
            "`relayproxy promote --candidate ... --relay ... [--relay ...] --relay-user admin --repl-user repl --json "
            "--timeout 60`, run again 0.5 s after an exit of 4, 5 or 6 and at once after its kill. The candidate's "
            "link is a `ThreadedFaultProxy` that reads up to 8 MB at a time and holds each read for the trial's "
            "delay (so the delay is mostly latency, not a throughput cap); at the kill it and any relay link are "
            "dropped without flushing and refuse connections.", ""]
    if report.get("notes"):
        out += [report["notes"].rstrip(), ""]
    what = (f"{len(rows)} randomized trials (seed {report['seed']}), each its own topology, the two promotions side "
            "by side in every trial")
    path.write_text(results_document("Lossless promotion: randomized trials, through the relay vs the direct candidate"
                                     " as it is", __file__, [], report["machine"], out, what=what,
                                     command=report["command"]))


def write_plot(path: Path, report: dict) -> bool:
    plt = benchinfo.pyplot()
    if plt is None:
        return False
    rows = [r for r in report["trials"] if r["error"] is None]
    if not rows:
        return False
    colors = {"master": "#4c72b0", "relay-kill": "#dd8452", "promote-kill": "#55a868", "fallback": "#c44e52"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 5.5))
    by_kind = {kind: [r for r in rows if r["spec"]["kind"] == kind] for kind in KINDS}
    by_kind = {kind: mine for kind, mine in by_kind.items() if mine}

    def scatter(mine: list[dict], key: str, **style) -> None:
        left.scatter([r["spec"]["candidate_delay"] * 1000 for r in mine], [r[key] for r in mine], **style)

    for kind, mine in by_kind.items():
        scatter(mine, "direct_lost", s=14, color=colors[kind], marker="o", alpha=0.7,
                label=f"{kind}: promoting the candidate as-is")
        scatter(mine, "lost", s=18, color=colors[kind], marker="x", label=f"{kind}: via the relay (acknowledged)")
    if "fallback" in by_kind:
        scatter(by_kind["fallback"], "unacked_lost", s=22, facecolors="none", edgecolors=colors["fallback"],
                marker="s", label="fallback: unacknowledged lost via the relay (the hole)")
    left.set_yscale("symlog", linthresh=1)
    left.set(xlabel="candidate link delay per chunk, ms", ylabel="commits lost in the trial (symlog)")
    left.set_title("Loss per trial", fontsize=9)
    left.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    kinds = list(by_kind)
    right.boxplot([[r["kill_to_writable"] for r in mine] for mine in by_kind.values()], whis=(5, 95), showfliers=True)
    right.set_xticks(range(1, len(kinds) + 1), kinds, fontsize=8)
    right.set_ylabel("seconds, master killed -> candidate writable")
    right.set_title("kill -> writable (box: quartiles, whiskers: p5-p95)", fontsize=9)
    fig.suptitle(f"relayproxy promote: {len(rows)} randomized trials (seed {report['seed']})", fontsize=10)
    save_figure(fig, path, dpi=110)
    return True


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=200, help="number of trials (default 200)")
    p.add_argument("--seed", type=int, default=1,
                   help="seed of the run: each trial's seed is drawn from it (default 1)")
    p.add_argument("--fallback-every", type=int, default=10, help="every k-th trial is a fallback trial (default 10; "
                   "0: none)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "lossless_trials.md",
                   help="markdown results; the plot goes beside it with the suffix .png")
    add_report_options(p, saved="every trial")
    p.add_argument("--workdir", type=Path, default=None, help="parent of the trials' directories (default $TMPDIR); "
                   "a trial that is not OK keeps its directory there")
    args = p.parse_args(argv)
    if args.trials < 1:
        p.error("--trials must be at least 1")
    return args


def measure(args: argparse.Namespace, argv: list[str]) -> dict:
    began = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="lossless-", dir=args.workdir))
    made_templates = TEMPLATE_ENV not in os.environ
    if made_templates:  # one mariadb-install-db per option set, copied for every server (as the tests do)
        os.environ[TEMPLATE_ENV] = str(workdir / "datadir-templates")
    try:
        trials = run_trials(args.trials, args.seed, fallback_every=args.fallback_every, workdir=workdir)
    finally:
        if made_templates:
            shutil.rmtree(workdir / "datadir-templates", ignore_errors=True)
    report = {"command": benchinfo.command_line(__file__, argv), "seed": args.seed, "trials": trials,
              "run_seconds": round(time.monotonic() - began, 1), "machine": benchinfo.machine_info(server=True)}
    if not any(p.name.startswith("trial") for p in workdir.iterdir()):
        shutil.rmtree(workdir, ignore_errors=True)
    return report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    out_md, out_png = args.out, args.out.with_suffix(".png")
    report = report_of(args, lambda: measure(args, argv))
    out_md.parent.mkdir(parents=True, exist_ok=True)
    write_markdown(out_md, report)
    plotted = write_plot(out_png, report)
    log(f"wrote {out_md}" + (f" and {out_png}" if plotted else " (no plot)") + f"; {len(report['trials'])} trials in "
        f"{report['run_seconds']:.0f} s")
    bad = [r for r in report["trials"] if r["spec"]["kind"] != "fallback" and not r["ok"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
