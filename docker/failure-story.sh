#!/usr/bin/env bash
# The failure story, in containers: a large transaction is half sent when the master dies (kill -9).
#
# The replica on the master directly is left with Read_Source_Log_Pos != Exec_Source_Log_Pos (it holds part of a
# transaction it can never finish), so an HA controller waiting for "everything received is applied" cannot
# switch. relayproxy advertises only complete transactions: its Read_Master_Log_Pos stays at the end of the last
# one, the replica behind it reaches Read == Exec at once, and the controller can switch.
#
# It brings up docker-compose.yml (MySQL 8.4) or docker-compose.mariadb.yml (MariaDB 11.4), points
# replica-relay at relayproxy and replica-direct at the master (both through the rate-limited `link`, so a big
# transaction takes seconds to stream), writes the transaction, kills the master with SIGKILL while the
# direct replica has about a quarter of it, then watches both replicas and the relay's /status side by side.
#
# usage: docker/failure-story.sh [--mariadb] [--rows N] [--row-bytes N] [--watch SECONDS] [--keep]
# Needs docker with `docker compose` (v2), or docker-compose (v1). LINK_RATE (bytes/s) sets the link's rate.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
project=relayproxy-story
flavour=mysql
rows=64             # rows of the big transaction ...
row_bytes=1048576   # ... of this many bytes each (at most the master's max_allowed_packet)
watch_seconds=20    # how long to watch after the kill
keep=0

usage() {
	sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
	cat <<-EOF

	options:
	  --mariadb          use docker-compose.mariadb.yml (MariaDB 11.4) instead of MySQL 8.4
	  --rows N           rows in the big transaction (default $rows)
	  --row-bytes N      bytes per row (default $row_bytes)
	  --watch SECONDS    how long to watch the replicas after the kill (default $watch_seconds)
	  --keep             leave the containers running at the end (default: docker compose down -v)
	EOF
}

die() {
	echo "failure-story: $*" >&2
	exit 1
}

positive() {
	[[ $2 =~ ^[1-9][0-9]*$ ]] || die "$1 needs a positive integer, got '$2'"
}

while (($#)); do
	case $1 in
		--mariadb) flavour=mariadb ;;
		--rows) positive "$1" "${2-}"; rows=$2; shift ;;
		--row-bytes) positive "$1" "${2-}"; row_bytes=$2; shift ;;
		--watch) positive "$1" "${2-}"; watch_seconds=$2; shift ;;
		--keep) keep=1 ;;
		-h | --help) usage; exit 0 ;;
		*) die "unknown argument '$1' (see --help)" ;;
	esac
	shift
done

if [[ $flavour == mysql ]]; then
	compose_file=$here/docker-compose.yml
	client=mysql
	show_master_status='SHOW BINARY LOG STATUS'
	read_label=Read_Source_Log_Pos
	exec_label=Exec_Source_Log_Pos
else
	compose_file=$here/docker-compose.mariadb.yml
	client=mariadb
	show_master_status='SHOW MASTER STATUS'
	read_label=Read_Master_Log_Pos
	exec_label=Exec_Master_Log_Pos
fi

if docker compose version >/dev/null 2>&1; then
	compose_cmd=(docker compose)
elif command -v docker-compose >/dev/null 2>&1; then
	compose_cmd=(docker-compose)
else
	die "needs docker compose (v2) or docker-compose (v1)"
fi

compose() {
	"${compose_cmd[@]}" --project-name "$project" --file "$compose_file" "$@"
}

# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
	local rc=$?
	[[ -z ${tmp-} ]] || rm -rf "$tmp"
	if ((keep)); then
		echo "left running; tear down with: ${compose_cmd[*]} --project-name $project --file $compose_file down -v"
	else
		echo "== tearing down"
		compose down -v --remove-orphans >/dev/null 2>&1 || true
	fi
	exit "$rc"
}

now() {
	date +%s.%N
}

since() { # seconds from $1 to now, one decimal
	awk -v start="$1" -v end="$(now)" 'BEGIN { printf "%.1f", end - start }'
}

mib() {
	awk -v bytes="$1" 'BEGIN { printf "%.1f MiB", bytes / 1048576 }'
}

# A quoted SQL string literal.
sql_string() {
	local text=${1//\\/\\\\}
	printf "'%s'" "${text//\'/\\\'}"
}

# Runs the server's client as root inside `service`, with the password from its db_root_password secret (never
# on a command line); extra arguments go to the client, SQL may come on stdin.
sql() {
	local service=$1
	shift
	# shellcheck disable=SC2016 # expanded by bash inside the container
	compose exec -T "$service" bash -c \
		'exec "$0" --defaults-extra-file=<(printf "[client]\nuser=root\npassword=%s\n" "$(cat /run/secrets/db_root_password)") --batch --skip-column-names "$@"' \
		"$client" "$@"
}

master_position() { # prints "file position"
	sql master -e "$show_master_status" | awk 'NR == 1 { print $1, $2 }'
}

# Prints "source_file read_pos exec_file exec_pos io_running sql_running" ("-" for what is not there yet).
replica_status() {
	sql "$1" --column-names -e 'SHOW REPLICA STATUS\G' | awk '
		BEGIN { f = r = ef = e = io = sq = "-" }
		{
			key = $1; sub(/:$/, "", key)
			value = substr($0, index($0, ": ") + 2)
			if (value == "") value = "-"
		}
		key == "Source_Log_File" || key == "Master_Log_File" { f = value }
		key == "Read_Source_Log_Pos" || key == "Read_Master_Log_Pos" { r = value }
		key == "Relay_Source_Log_File" || key == "Relay_Master_Log_File" { ef = value }
		key == "Exec_Source_Log_Pos" || key == "Exec_Master_Log_Pos" { e = value }
		key == "Replica_IO_Running" || key == "Slave_IO_Running" { io = value }
		key == "Replica_SQL_Running" || key == "Slave_SQL_Running" { sq = value }
		END { print f, r, ef, e, io, sq }'
}

# Prints "master_log_file read_master_log_pos io_running received_up_to" from the relay's GET /status, asked
# with `relayproxy status` in the relay's container (it exits 3 while the upstream is down, which is expected).
relay_status() {
	local document
	document=$(compose exec -T relayproxy relayproxy status --json --http 127.0.0.1:8080) || true
	awk '
		BEGIN { f = r = io = seen = "-" }
		/^  "master_log_file": / { f = $2 }
		/^  "read_master_log_pos": / { r = $2 }
		/^  "io_running": / { io = $2 }
		/^  "master_position": \{/ { inside = 1 }
		inside && /^    "position": / { seen = $2; inside = 0 }
		END { gsub(/[",]/, "", f); gsub(/,/, "", r); gsub(/,/, "", io); gsub(/,/, "", seen); print f, r, io, seen }
	' <<<"$document"
}

# Waits until `service` is healthy (or running, for a service without a healthcheck).
wait_ready() {
	local service=$1 deadline=$((SECONDS + $2)) id state
	while :; do
		id=$(compose ps -q "$service" 2>/dev/null || true)
		state=missing
		if [[ -n $id ]]; then
			state=$(docker inspect --format \
				'{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' "$id" 2>/dev/null ||
				echo missing)
		fi
		case $state in
			healthy) return 0 ;;
			running) [[ $(docker inspect --format '{{.State.Health}}' "$id") == "<nil>" ]] && return 0 ;;
			exited | dead | unhealthy)
				compose logs --tail 40 "$service" >&2 || true
				die "$service is $state"
				;;
		esac
		((SECONDS < deadline)) || {
			compose logs --tail 40 "$service" >&2 || true
			die "$service not ready after $2 s (state: $state)"
		}
		sleep 2
	done
}

# Waits until the replica has applied everything up to the master's "file position".
wait_applied() {
	local service=$1 file=$2 position=$3 deadline=$((SECONDS + 180)) status
	while :; do
		read -r -a status <<<"$(replica_status "$service")"
		if [[ ${status[2]} == "$file" && ${status[3]} == "$position" ]]; then
			return 0
		fi
		if ((SECONDS >= deadline)); then
			sql "$service" --column-names -e 'SHOW REPLICA STATUS\G' >&2 || true
			die "$service did not reach $file:$position (it is at ${status[*]})"
		fi
		sleep 1
	done
}

# -- 1. the topology -------------------------------------------------------------------------------------------
trap cleanup EXIT
IFS= read -r repl_password <"$here/secrets/replication-password" || true
[[ -n $repl_password ]] || die "$here/secrets/replication-password is empty"

echo "== $flavour topology ($compose_file) with ${compose_cmd[*]}"
compose down -v --remove-orphans >/dev/null 2>&1 || true
compose build
compose up -d
for service in master link relayproxy replica-relay replica-direct; do
	wait_ready "$service" 300
done

echo "== the master's first transactions, and the relay catching up with them"
sql master <<-'EOSQL'
	CREATE DATABASE story;
	CREATE TABLE story.big (id INT AUTO_INCREMENT PRIMARY KEY, pad LONGBLOB NOT NULL) ENGINE=InnoDB;
	INSERT INTO story.big (pad) VALUES ('before the story');
EOSQL
read -r start_file start_position <<<"$(master_position)"
deadline=$((SECONDS + 120))
until read -r relay_file relay_position _ <<<"$(relay_status)" &&
	[[ $relay_file == "$start_file" && $relay_position == "$start_position" ]]; do
	((SECONDS < deadline)) || die "relayproxy did not reach $start_file:$start_position (it is at $relay_file:$relay_position)"
	sleep 1
done
echo "relayproxy is at $relay_file:$relay_position, as the master"

echo "== replica-relay replicates from relayproxy, replica-direct from the master (through the link)"
if [[ $flavour == mysql ]]; then
	# No TLS on the relay's --listen here: caching_sha2_password then needs the server's RSA key, which
	# GET_SOURCE_PUBLIC_KEY=1 fetches (relayproxy and MySQL both serve it).
	for pair in replica-relay:relayproxy replica-direct:link; do
		sql "${pair%%:*}" -e "CHANGE REPLICATION SOURCE TO SOURCE_HOST='${pair#*:}', SOURCE_PORT=3306,
			SOURCE_USER='repl', SOURCE_PASSWORD=$(sql_string "$repl_password"), SOURCE_AUTO_POSITION=1,
			GET_SOURCE_PUBLIC_KEY=1, SOURCE_CONNECT_RETRY=1; START REPLICA;"
	done
else
	# MariaDB 11.4 replicas ask for TLS and verify the certificate by default; the relay's --listen has no
	# certificate here, so both replicas use plain TCP on the compose network (like for like).
	for pair in replica-relay:relayproxy replica-direct:link; do
		sql "${pair%%:*}" -e "CHANGE MASTER TO MASTER_HOST='${pair#*:}', MASTER_PORT=3306,
			MASTER_USER='repl', MASTER_PASSWORD=$(sql_string "$repl_password"), MASTER_USE_GTID=slave_pos,
			MASTER_SSL=0, MASTER_SSL_VERIFY_SERVER_CERT=0, MASTER_CONNECT_RETRY=1; START SLAVE;"
	done
fi
wait_applied replica-relay "$start_file" "$start_position"
wait_applied replica-direct "$start_file" "$start_position"
echo "both replicas applied everything up to $start_file:$start_position"

# -- 2. the big transaction, and the kill ----------------------------------------------------------------------
echo "== one transaction of $rows rows x $row_bytes bytes on the master"
{
	echo "BEGIN;"
	for ((i = 0; i < rows; i++)); do
		echo "INSERT INTO story.big (pad) VALUES (REPEAT('x', $row_bytes));"
	done
	echo "COMMIT;"
} | sql master
read -r end_file end_position <<<"$(master_position)"
[[ $end_file == "$start_file" ]] || die "the master rotated its binlog during the story ($start_file -> $end_file)"
size=$((end_position - start_position))
kill_at=$((start_position + size / 4))
echo "committed: it spans $start_file:$start_position..$end_position ($(mib "$size")) in the master's binlog"

echo "== waiting until replica-direct has about a quarter of it, then kill -9 the master"
deadline=$((SECONDS + 120))
while :; do
	read -r -a direct <<<"$(replica_status replica-direct)"
	if [[ ${direct[1]} =~ ^[0-9]+$ ]] && ((direct[1] >= kill_at)); then
		break
	fi
	((SECONDS < deadline)) || die "replica-direct did not start receiving the transaction (at ${direct[*]})"
done
if ((direct[1] >= end_position)); then
	die "replica-direct already had the whole transaction before the kill: use more --rows or a lower LINK_RATE"
fi
compose kill -s SIGKILL master
killed_at=$(now)
echo "master killed with replica-direct at ${direct[1]} ($(mib $((direct[1] - start_position))) of the transaction)"

# -- 3. what each replica looks like now -----------------------------------------------------------------------
tmp=$(mktemp -d)
relay_switch="" direct_switch=""
printf '%-7s | %-36s | %-36s | %s\n' "t (s)" "replica-relay: Read / Exec" "replica-direct: Read / Exec" \
	"relayproxy: advertised / received"
while :; do
	t=$(since "$killed_at")
	replica_status replica-relay >"$tmp/replica-relay" &
	replica_status replica-direct >"$tmp/replica-direct" &
	relay_status >"$tmp/relay" &
	wait
	read -r -a via <<<"$(cat "$tmp/replica-relay")"
	read -r -a direct <<<"$(cat "$tmp/replica-direct")"
	read -r -a relay <<<"$(cat "$tmp/relay")"
	printf '%-7s | %-36s | %-36s | %s\n' "+$t" "${via[1]-} / ${via[3]-}" "${direct[1]-} / ${direct[3]-}" \
		"${relay[1]-} / ${relay[3]-}"
	if [[ -z $relay_switch && ${via[1]-} == "${via[3]-}" && ${via[0]-} == "${via[2]-}" && ${via[1]-} != - ]]; then
		relay_switch=$t
	fi
	if [[ -z $direct_switch && ${direct[1]-} == "${direct[3]-}" && ${direct[0]-} == "${direct[2]-}" &&
		${direct[1]-} != - ]]; then
		direct_switch=$t
	fi
	awk -v t="$t" -v limit="$watch_seconds" 'BEGIN { exit !(t >= limit) }' && break
done

echo
echo "== after kill -9 of the master, mid-transaction (the transaction: $start_file:$start_position..$end_position)"
printf '%-24s %-30s %s\n' "" "replica-relay (via relay)" "replica-direct (on master)"
printf '%-24s %-30s %s\n' "Source_Log_File" "${via[0]-}" "${direct[0]-}"
printf '%-24s %-30s %s\n' "$read_label" "${via[1]-}" "${direct[1]-}"
printf '%-24s %-30s %s\n' "$exec_label" "${via[3]-}" "${direct[3]-}"
printf '%-24s %-30s %s\n' "HA may switch after" "${relay_switch:-never}${relay_switch:+ s}" \
	"${direct_switch:-not within $watch_seconds s}${direct_switch:+ s}"
echo "relayproxy /status: read_master_log_pos ${relay[1]-} (the last complete transaction), received up to ${relay[3]-}"

if [[ -n $relay_switch && -z $direct_switch && ${via[1]-} == "$start_position" ]]; then
	echo "as told: the direct replica holds $(mib $((direct[1] - start_position))) of a transaction it can never" \
		"apply; the replica behind relayproxy was switchable after $relay_switch s"
	exit 0
fi
echo "the story did not play out as told (see the figures above)" >&2
exit 1
