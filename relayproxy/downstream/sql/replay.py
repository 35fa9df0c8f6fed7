"""Replay stops on the SQL port (relay/replay_stops.py): what `relayproxy pitr` sets on the relay before its target
replicates, so the relay never sends the target a byte past the recovery point.

    RELAYPROXY SET REPLAY STOP FOR SERVER_ID n AT 'file' pos [LABEL 'text']
    RELAYPROXY CLEAR REPLAY STOP FOR SERVER_ID n
    SHOW RELAYPROXY REPLAY STOPS

SET checks that the relay holds the point: ``file`` is a relay file, ``pos`` a transaction boundary in it at or
before the durable horizon; its answer's info names the GTID state there (what the target will end at). The file
is read up to ``pos``, and the registry made durable before the answer, in a worker thread (``slicing.in_thread``),
never on the event loop. Both changes need the admin privilege (the servers' REPLICATION SLAVE ADMIN); SHOW needs what SHOW SLAVE
STATUS needs.
"""

from __future__ import annotations

import time

from ...log import get_logger
from ...relay.catalog import CatalogError
from ...relay.replay_stops import ReplayStop, ReplayStopsError
from ...wire.errors import ER_UNKNOWN_ERROR, ER_UNKNOWN_TARGET_BINLOG, ER_WRONG_ARGUMENTS
from ...wire.results import OkResponse, Response, ResultSet
from .. import privileges
from .env import Env
from .errors import SqlError
from .functions import NOT_A_BOUNDARY, gtids_at, state_text
from .parser import Parser
from .slicing import in_thread

log = get_logger("relayproxy.downstream.sql")

COLUMNS = ["Server_id", "File", "Position", "Gtid_state", "Label", "Created", "Persistent"]


def run_replay(p: Parser, env: Env) -> Response:
    """RELAYPROXY SET|CLEAR REPLAY STOP ... (the SQL layer's ordinary dispatch; disk work through ``in_thread``)."""
    ctx, conn = env.ctx, env.conn
    p.expect_word("RELAYPROXY")
    verb = p.expect_word("SET", "CLEAR")
    p.expect_word("REPLAY")
    p.expect_word("STOP")
    p.expect_word("FOR")
    p.expect_word("SERVER_ID")
    server_id = _number(p, "SERVER_ID")
    if verb == "CLEAR":
        p.end_of_statement()
        env.require(privileges.REPLICATION_ADMIN)
        old = _saved(in_thread, ctx.replay_stops.clear, server_id)
        log.info("replay stop cleared", server_id=server_id, conn_id=conn.conn_id, user=conn.user,
                 stop=None if old is None else f"{old.file}:{old.position}")
        return OkResponse(affected_rows=int(old is not None))
    p.expect_word("AT")
    name = p.string()
    position = _number(p, "position")
    label = p.string() if p.accept_word("LABEL") else ""
    p.end_of_statement()
    env.require(privileges.REPLICATION_ADMIN)
    return _set(env, server_id, name, position, label)


def show_replay_stops(p: Parser, env: Env) -> ResultSet:
    """After SHOW: RELAYPROXY REPLAY STOPS."""
    p.expect_word("RELAYPROXY")
    p.expect_word("REPLAY")
    p.expect_word("STOPS")
    p.end_of_statement()
    env.require(privileges.SHOW_REPLICA_STATUS)
    stops = env.ctx.replay_stops
    rows = [[s.server_id, s.file, s.position, s.gtid_state, s.label,
             time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(s.created)), "Yes" if stops.persistent else "No"]
            for s in stops.all()]
    return ResultSet(COLUMNS, rows)


def _saved(run, fn, *args):
    """A change of the registry (made durable in a worker thread); its errors as the statement's ERR."""
    try:
        return run(fn, *args)
    except ReplayStopsError as exc:
        raise SqlError(ER_WRONG_ARGUMENTS, "HY000", f"replay stop: {exc}") from None
    except OSError as exc:
        raise SqlError(ER_UNKNOWN_ERROR, "HY000", f"replay stop not saved: {exc}") from None


def _number(parser: Parser, what: str) -> int:
    tok = parser.cur
    if tok.kind != "number" or not isinstance(tok.value, int):
        raise SqlError(ER_WRONG_ARGUMENTS, "HY000", f"{what}: expected a whole number")
    parser.advance()
    return tok.value


def _set(env: Env, server_id: int, name: str, position: int, label: str) -> Response:
    ctx = env.ctx
    try:
        files = list(env.catalog.files())
    except CatalogError as exc:
        raise SqlError(ER_UNKNOWN_ERROR, "HY000", f"replay stop: cannot list the relay's files: {exc}") from None
    names = [f.name for f in files]
    info = next((f for f in files if f.name == name), None)
    if info is None:
        held = f"its history is {names[0]} .. {names[-1]}" if names else "it holds no file"
        raise SqlError(ER_UNKNOWN_TARGET_BINLOG, "HY000",
                       f"replay stop: '{name}' is not a relay file (purged, or not received yet); {held}")
    snap = ctx.horizon.snapshot()
    durable = snap.position if snap.file == name else info.size
    if not 4 <= position <= durable:
        raise SqlError(ER_WRONG_ARGUMENTS, "HY000",
                       f"replay stop: '{name}' {position} is past what the relay holds durably ({name} ends at "
                       f"{durable} now; the horizon is {snap.file}:{snap.position})")
    if position == 4:
        state = info.start_gtids
    else:
        state = in_thread(gtids_at, ctx.store.path(name), position)
        if state is NOT_A_BOUNDARY:
            raise SqlError(ER_WRONG_ARGUMENTS, "HY000",
                           f"replay stop: '{name}' {position} is not a transaction boundary of the relay's files")
        if state is None:
            state = info.start_gtids
    stop = ReplayStop(server_id, name, position, state_text(state) or "", label, time.time())
    _saved(in_thread, ctx.replay_stops.set, stop)
    log.info("replay stop set", server_id=server_id, file=name, position=position, gtid_state=stop.gtid_state,
             label=label, conn_id=env.conn.conn_id, user=env.conn.user, persistent=ctx.replay_stops.persistent)
    kept = "" if ctx.replay_stops.persistent else " (in memory only: this relay may not write its directory)"
    return OkResponse(info=f"replay stop for server_id {server_id} at {name}:{position}, "
                           f"GTID state there '{stop.gtid_state}'{kept}")
