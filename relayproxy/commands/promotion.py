"""What `relayproxy promote` decides from GTID state alone (no I/O): which relay is the most advanced, whether relays
diverge, what the candidate lacks and what it has that no relay has.

Two flavours of "what a server holds":

- MySQL: a GTID set (`@@gtid_executed`); containment and difference are exact.
- MariaDB: a binlog state (`@@gtid_binlog_state`, one latest GTID per (domain, server_id)), merged with the
  replica's `@@gtid_slave_pos` for a candidate. A server holds a GTID d-s-n when its entry for (d, s) is at n
  or later: within a domain sequence numbers only grow (gtid_strict_mode's rule, and what MariaDB's own
  MASTER_GTID_WAIT and slave_pos connect assume), so having s's n' >= n means having seen s's n.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from ..binlog.gtid import GtidSet, MariaBinlogState, MariaGtid, MariaGtidPosition

History = Union[GtidSet, MariaBinlogState]

# exit codes of `relayproxy promote` (documented in docs/failover.md and --help)
EXIT_DONE = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_UNREACHABLE = 4
EXIT_TIMED_OUT = 5
EXIT_REPLICAS_LEFT = 6


def parse_history(flavour: str, text: str | None) -> History:
    """A server's GTID text as the flavour's history (MySQL set, MariaDB state); None/'' is empty."""
    text = (text or "").strip()
    if flavour == "mysql":
        return GtidSet(text.replace("\n", ""))
    return MariaBinlogState.parse(text.replace("\n", "").replace(" ", ""))


def merge_mariadb(state: MariaBinlogState, *others: MariaBinlogState | MariaGtidPosition) -> MariaBinlogState:
    """The union of MariaDB states/positions: per (domain, server_id) the later seq_no."""
    merged = state.copy()
    for other in others:
        for gtid in other:
            have = merged.get(gtid.domain_id, gtid.server_id)
            if have is None or have.seq_no < gtid.seq_no:
                merged.update(gtid)
    return merged


def _maria_holds(have: MariaBinlogState, gtid: MariaGtid) -> bool:
    entry = have.get(gtid.domain_id, gtid.server_id)
    return entry is not None and entry.seq_no >= gtid.seq_no


@dataclass(frozen=True)
class Lack:
    """What `have` lacks of `want`, as text a person reads, and a transaction count (exact for MySQL; for MariaDB
    the sum of sequence-number gaps per (domain, server), exact when one server writes each domain)."""

    text: str
    count: int

    def __bool__(self) -> bool:
        return bool(self.text)


def lacks(have: History, want: History) -> Lack:
    """What `want` holds that `have` does not."""
    if isinstance(want, GtidSet):
        assert isinstance(have, GtidSet)
        missing = want.subtract(have)
        return Lack(missing.format(","), missing.count())
    assert isinstance(have, MariaBinlogState)
    parts: list[str] = []
    count = 0
    for gtid in want:
        if _maria_holds(have, gtid):
            continue
        entry = have.get(gtid.domain_id, gtid.server_id)
        if entry is None and have.latest(gtid.domain_id) is None:
            first = MariaGtid(gtid.domain_id, gtid.server_id, 1)  # the whole domain is missing
            parts.append(str(gtid) if gtid.seq_no <= 1 else f"{first}..{gtid}")
            count += max(1, gtid.seq_no)
        elif entry is None:  # other servers wrote the domain too: which of its numbers are this server's is unknown
            parts.append(f"{gtid} and earlier GTIDs of server {gtid.server_id} in domain {gtid.domain_id}")
            count += 1
        else:
            first = MariaGtid(gtid.domain_id, gtid.server_id, entry.seq_no + 1)
            parts.append(str(gtid) if first == gtid else f"{first}..{gtid}")
            count += gtid.seq_no - entry.seq_no
    return Lack(", ".join(parts), count)


def holds(have: History, want: History) -> bool:
    return not lacks(have, want)


def union(histories: list[History]) -> History | None:
    if not histories:
        return None
    if isinstance(histories[0], GtidSet):
        out = GtidSet()
        for h in histories:
            out.update(h)
        return out
    return merge_mariadb(histories[0], *histories[1:])


@dataclass
class RelayFacts:
    """What one relay said: its address, the master its files came from, its complete-transaction history."""

    address: str
    history: History
    master_server_id: int = 0  # 0: the relay does not know (never reached its master since it started)
    master_address: str = ""
    follows_candidate: bool = False  # already repointed to the candidate (a run that is being repeated)
    master_uuid: str = ""  # MySQL: the master's server_uuid, when the relay knows it


@dataclass
class CandidateFacts:
    address: str
    history: History  # what it has executed (MySQL gtid_executed; MariaDB binlog state merged with slave_pos)
    is_replica: bool
    server_id: int = 0
    read_only: bool = True


@dataclass
class Plan:
    """The decision: catch the candidate up from `source` (unless it holds it already), then promote it."""

    source: RelayFacts
    lacking: Lack  # what the candidate lacks of the source relay
    errant: Lack  # what the candidate has that no relay has, written by another server than the relays' master
    behind: dict[str, Lack] = field(default_factory=dict)  # other relays: what they lack of the source
    unrelayed: Lack = Lack("", 0)  # the relays' master's own transactions the candidate received and no relay did

    @property
    def needs_catch_up(self) -> bool:
        return bool(self.lacking)


class Refusal(Exception):
    """The facts forbid a promotion; the message names the servers and GTIDs."""


def split_by_origin(history: History, server_id: int, uuid: str) -> tuple[History, History]:
    """(what the master `server_id` / `uuid` wrote, the rest) of a history. With the master unknown, all is rest."""
    if isinstance(history, GtidSet):
        mine, rest = GtidSet(), GtidSet()
        for sid, tag, start, end in history.intervals():
            (mine if uuid and sid == uuid.lower() else rest).add_interval(sid, start, end + 1, tag)
        return mine, rest
    mine_state, rest_state = MariaBinlogState(), MariaBinlogState()
    for gtid in history:
        (mine_state if server_id and gtid.server_id == server_id else rest_state).update(gtid)
    return mine_state, rest_state


def decide(candidate: CandidateFacts, relays: list[RelayFacts], *, strict: bool = False,
           detached_ok: bool = False) -> Plan:
    """Pick the most advanced relay and say what the candidate needs; raise Refusal when relays disagree (other
    masters, diverged histories), when the candidate is no replica and lacks what the relays hold (unless
    `detached_ok` and it is still read-only: an HA tool detached it without opening it to writes), or (strict)
    when the candidate has errant GTIDs."""
    if not relays:
        raise Refusal("no relay answered: there is nothing to catch the candidate up from")
    masters = {r.master_server_id for r in relays if r.master_server_id and not r.follows_candidate}
    if len(masters) > 1:
        named = "; ".join(f"{r.address} relays server_id {r.master_server_id} ({r.master_address})"
                          for r in relays if r.master_server_id and not r.follows_candidate)
        raise Refusal(f"the relays relay different masters: {named}")
    source = relays[0]
    for relay in relays[1:]:
        if holds(relay.history, source.history):
            if not holds(source.history, relay.history) or (relay.follows_candidate < source.follows_candidate):
                source = relay  # strictly further; on a tie, one still relaying the old master
    for relay in relays:
        extra = lacks(source.history, relay.history)
        if extra:
            theirs = lacks(relay.history, source.history)
            raise Refusal(f"the relays diverge: {relay.address} has {extra.text} that {source.address} lacks, and "
                          f"{source.address} has {theirs.text or 'nothing'} that {relay.address} lacks; no relay holds "
                          "every transaction of the others")
    lacking = lacks(candidate.history, source.history)
    everything = union([r.history for r in relays])
    # What the candidate has beyond every relay: the relays' master's own transactions it received and no relay did
    # (never acknowledged through a relay: kept, and said), and transactions of any other origin (errant).
    master_id = next(iter(masters), 0)
    master_uuid = next((r.master_uuid for r in relays if r.master_uuid and not r.follows_candidate), "")
    from_master, foreign = split_by_origin(candidate.history, master_id, master_uuid)
    errant = lacks(everything, foreign)
    unrelayed = lacks(everything, from_master)
    if lacking and not candidate.is_replica:
        if not candidate.read_only:
            raise Refusal(f"the candidate {candidate.address} is not a replica (it has no replication configured), "
                          f"is writable (read_only off) and lacks {lacking.text} that the relay {source.address} "
                          "holds: it is another master already, or not a server of this topology; transactions "
                          "written on it since would conflict with what it lacks")
        if not detached_ok:
            raise Refusal(f"the candidate {candidate.address} is not a replica (it has no replication configured) and "
                          f"lacks {lacking.text} that the relay {source.address} holds; name a replica of the failed "
                          "master, or pass --candidate-detached if an HA tool detached this read-only candidate")
    if strict and errant:
        raise Refusal(f"--strict: the candidate {candidate.address} has GTIDs that no relay has (errant "
                      f"transactions): {errant.text}")
    behind = {r.address: lacks(r.history, source.history) for r in relays if r is not source}
    return Plan(source, lacking, errant, {a: b for a, b in behind.items() if b}, unrelayed)


def position_text(history: History) -> str:
    """The short form a person compares: MySQL's set, MariaDB's per-domain position."""
    if isinstance(history, GtidSet):
        return history.format(",")
    return str(history.current_position())
