# Creates the replication account on the master at its first start: relayproxy and the direct replica log in
# with it, and the relay's replicas use the same name and password (RELAYPROXY_USERS), so a replica can be
# repointed between the relay and the master without new credentials.
#
# The official mysql and mariadb images *source* this file (it is not executable) from
# /docker-entrypoint-initdb.d while their temporary init server runs, so docker_process_sql is at hand.
# The password is read from the replication_password secret: it is written nowhere else.
# shellcheck shell=bash

repl_user=repl
repl_password_file=/run/secrets/replication_password
if [ ! -r "$repl_password_file" ]; then
	echo "10-replication-user.sh: cannot read $repl_password_file (the replication_password secret)" >&2
	exit 1
fi
IFS= read -r repl_password < "$repl_password_file" || true
if [ -z "$repl_password" ]; then
	echo "10-replication-user.sh: $repl_password_file is empty" >&2
	exit 1
fi
# Inside a quoted SQL literal only the backslash and the quote need escaping.
repl_password_sql=${repl_password//\\/\\\\}
repl_password_sql=${repl_password_sql//\'/\\\'}

if [ -n "${MARIADB_VERSION:-}" ]; then
	# MariaDB: mysql_native_password (its default), which relayproxy offers MariaDB replicas too.
	# REPLICATION CLIENT is BINLOG MONITOR there: SHOW BINARY LOGS, which the relay asks when it bootstraps.
	repl_identified="IDENTIFIED BY '${repl_password_sql}'"
else
	# MySQL 8.4: caching_sha2_password, the default, spelled out because it is the point of this topology.
	repl_identified="IDENTIFIED WITH caching_sha2_password BY '${repl_password_sql}'"
fi

docker_process_sql --database=mysql <<EOSQL
CREATE USER '${repl_user}'@'%' ${repl_identified};
GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '${repl_user}'@'%';
EOSQL
unset repl_password repl_password_sql repl_identified
