# shellcheck shell=bash
# MariaDB's part of remusdb-clone-identity (sourced by it: uses its die,
# say, options and MY* paths).  docs/fork.md, "MariaDB", has the design.

my_sql() { mariadb -N -B -e "$1" 2>&1; }
my_running() { pgrep -x mariadbd >/dev/null; }
my_last_error() {
	journalctl -u "$MYUNIT" -n 50 --no-pager -o cat 2>/dev/null | grep -E '\[ERROR\]' | tail -n1
}

# The clone's mariadbd runs the parent's sessions on from the fork: each
# moment it lives it may commit (an in-flight COMMIT, in its own order).
# SIGKILL at once, no shutdown: nothing more reaches its binlog.  Debian's
# unit restarts a killed server (Restart=on-abort, 5 s later): the stop
# that follows cancels that and marks the unit stopped.
my_kill() {
	pids=$(pgrep -x mariadbd)
	[ -z "$pids" ] || kill -KILL $pids 2>/dev/null
	systemctl stop "$MYUNIT" >/dev/null 2>&1
	for _ in $(seq 50); do my_running || break; sleep 0.1; done
	my_running && die 4 "mariadbd still runs after SIGKILL"
	systemctl reset-failed "$MYUNIT" >/dev/null 2>&1 || true
	say "mariadb: killed${pids:+ (pid $(echo $pids))}"
}

# What the clone's binlog holds, as it left it (before crash recovery, which
# opens a new file): the host compares these bytes with the parent's.
my_binlog_manifest() {
	while IFS= read -r f; do
		[ -n "$f" ] || continue
		name=${f##*/}
		path=$MYDATA/$name
		[ -r "$path" ] || die 5 "binlog $path (in the index) is missing"
		size=$(stat -c %s "$path") && sum=$(head -c "$size" "$path" | sha256sum | cut -d' ' -f1) \
			|| die 5 "cannot read $path"
		say "binlog: $name $size $sum"
	done < "$MYBINLOG_INDEX"
}

# The clone's own settings, read after the image's 61-remusdb-replication.cnf.
my_write_cnf() {  # SERVER_ID READ_ONLY(0|1) SKIP_SLAVE_START(0|1)
	{ echo "# written by $PROG at $(date -u +%FT%TZ): this clone's own settings"
	  echo "[mariadbd]"
	  echo "server_id = $1"
	  [ "$2" = 0 ] || echo "read_only = ON"
	  [ "$3" = 0 ] || echo "skip_slave_start"
	} > "$MYCLONE_CNF.new" && mv "$MYCLONE_CNF.new" "$MYCLONE_CNF" || die 5 "cannot write $MYCLONE_CNF"
}

my_start() {
	systemctl reset-failed "$MYUNIT" >/dev/null 2>&1 || true
	# systemd waits for the server's readiness (crash recovery included).
	timeout "$wait_timeout" systemctl start "$MYUNIT" >/dev/null 2>&1 \
		|| die 4 "mariadbd did not start (log: $(my_last_error))"
	[ "$(my_sql 'SELECT @@server_id')" = "$1" ] || die 4 "mariadbd runs without server_id $1"
}

my_prepare_replica() {
	rm -f "$MYDATA/master.info" "$MYDATA/relay-log.info"
	my_write_cnf "$server_id" 1 1
	my_start "$server_id"
	# Recovery has committed exactly what the clone's binlog holds: the
	# parent's transactions after that are what it must fetch.
	gtid=$(my_sql 'SELECT @@GLOBAL.gtid_binlog_pos') || die 4 "cannot read gtid_binlog_pos: $gtid"
	out=$(my_sql "STOP SLAVE; RESET SLAVE ALL; SET GLOBAL gtid_slave_pos = '$gtid';
		CHANGE MASTER TO MASTER_HOST='$primary_host', MASTER_PORT=$primary_port,
		MASTER_USER='$repl_user', MASTER_PASSWORD='$repl_password',
		MASTER_CONNECT_RETRY=1, MASTER_USE_GTID=slave_pos") \
		|| die 7 "CHANGE MASTER failed: $out"
	say "gtid: $gtid"
	say "replica: prepared, server_id $server_id, read_only, replication of $primary_host:$primary_port not started"
}

my_slave_field() {  # NAME: one field of SHOW SLAVE STATUS
	mariadb -e 'SHOW SLAVE STATUS\G' 2>/dev/null | sed -n "s/^ *$1: //p"
}

my_start_replica() {
	my_running || die 4 "mariadbd is not running (run --phase prepare first)"
	[ -n "$(my_slave_field Master_Host)" ] || die 7 "no master configured (run --phase prepare first)"
	out=$(my_sql 'START SLAVE') || die 7 "START SLAVE failed: $out"
	deadline=$(( $(date +%s) + wait_timeout ))
	while :; do
		io=$(my_slave_field Slave_IO_Running); sql=$(my_slave_field Slave_SQL_Running)
		[ "$io,$sql" = "Yes,Yes" ] && break
		err=$(my_slave_field Last_SQL_Error)
		[ -z "$err" ] || die 7 "replication SQL error: $err"
		[ "$sql" != No ] || die 7 "the replication SQL thread stopped"
		[ "$(date +%s)" -lt "$deadline" ] \
			|| die 6 "replication did not start within $wait_timeout s (IO $io, SQL $sql: $(my_slave_field Last_IO_Error))"
		sleep 0.5
	done
	# A reboot of the replica resumes replication from now on.
	sid=$(my_sql 'SELECT @@server_id')
	my_write_cnf "$sid" 1 0
	say "replica: GTID replica of $(my_slave_field Master_Host):$(my_slave_field Master_Port) from $(my_sql 'SELECT @@GLOBAL.gtid_slave_pos'), IO $io, SQL $sql"
}

# An independent primary: its binlog and GTID position go on from the
# parent's (new GTIDs carry the new server_id in the parent's domain).
my_make_copy() {
	if systemctl is-active --quiet "$MYUNIT"; then
		systemctl stop "$MYUNIT" >/dev/null 2>&1 || die 4 "clean stop of mariadb failed"
	elif my_running; then
		mariadb-admin shutdown >/dev/null 2>&1 || die 4 "mariadb-admin shutdown failed"
	fi
	for _ in $(seq 100); do my_running || break; sleep 0.1; done
	my_running && die 4 "mariadbd still runs after a clean stop"
	rm -f "$MYDATA/master.info" "$MYDATA/relay-log.info"
	my_write_cnf "$server_id" 0 1
	my_start "$server_id"
	out=$(my_sql 'RESET SLAVE ALL') || die 4 "RESET SLAVE ALL failed: $out"
	my_write_cnf "$server_id" 0 0
	[ "$(my_sql 'SELECT @@read_only')" = 0 ] || die 4 "the copy is read-only"
	say "copy: independent primary, server_id $server_id, binlog at $(my_sql 'SELECT @@GLOBAL.gtid_binlog_pos')"
}
