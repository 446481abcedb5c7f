#!/bin/sh
# mmdebstrap customize hook: runs on the host with the guest tree as $1.
set -eu
root=$1
in_guest() { chroot "$root" "$@"; }

in_guest passwd -d root >/dev/null            # serial console login for debugging
in_guest systemctl enable rdb-net.service >/dev/null 2>&1
# MariaDB is installed for the DBMS work but not started by default: under
# TCG every service costs boot time and guest memory.
in_guest systemctl disable mariadb.service >/dev/null 2>&1 || true
for unit in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer \
	    e2scrub_reap.service fstrim.timer; do
	in_guest systemctl mask "$unit" >/dev/null 2>&1 || true
done

# PostgreSQL: password auth from the LAN, a `bench` role and database
# initialized for pgbench (scale 5), and amcheck for pg_amcheck.
echo "host all all 0.0.0.0/0 scram-sha-256" >> "$root/etc/postgresql/15/main/pg_hba.conf"
# Streaming replication for forked clones (docs/fork.md): a `replicator`
# role, from the lab LAN only.  The lab's password, like bench's.
echo "host replication replicator 10.77.0.0/24 scram-sha-256" >> "$root/etc/postgresql/15/main/pg_hba.conf"
in_guest pg_ctlcluster 15 main start
in_guest su postgres -c "psql -q -c \"CREATE ROLE bench LOGIN PASSWORD 'bench'\""
in_guest su postgres -c "createdb -O bench bench"
in_guest su postgres -c "psql -q -c \"CREATE ROLE replicator REPLICATION LOGIN PASSWORD 'replicator'\" -c 'GRANT EXECUTE ON FUNCTION pg_backup_start(text, boolean) TO replicator' -c 'GRANT EXECUTE ON FUNCTION pg_backup_stop(boolean) TO replicator'"
in_guest su postgres -c "psql -q -d bench -c 'CREATE EXTENSION amcheck' -c 'GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO bench'"
in_guest env PGPASSWORD=bench pgbench -q -i -s 5 -h 127.0.0.1 -U bench bench
in_guest pg_ctlcluster 15 main stop

# MariaDB (not started at boot): a `bench` user and database for the tests,
# made with the patched mariadbd the tree now has.  Only the Unix socket
# while we work in the tree.
install -d -o 0 -g 0 "$root/run/mysqld"
in_guest chown mysql:mysql /run/mysqld
in_guest /usr/sbin/mariadbd --user=mysql --skip-networking &
mariadbd_pid=$!
i=0
until in_guest mariadb-admin --silent ping >/dev/null 2>&1; do
	i=$((i + 1))
	if [ $i -gt 60 ] || ! kill -0 $mariadbd_pid 2>/dev/null; then
		echo "customize.sh: mariadbd did not start in the guest tree" >&2
		exit 1
	fi
	sleep 1
done
in_guest mariadb -e "CREATE DATABASE bench; CREATE USER 'bench'@'%' IDENTIFIED BY 'bench'; GRANT ALL ON bench.* TO 'bench'@'%';"
# GTID replication for forked clones (docs/fork.md, "MariaDB"): a
# `replicator` user, from the lab LAN only, with the lab's password; RELOAD
# for BACKUP STAGE BLOCK_COMMIT, which fork holds across the snapshot.
in_guest mariadb -e "CREATE USER 'replicator'@'10.77.0.%' IDENTIFIED BY 'replicator'; GRANT REPLICATION SLAVE, RELOAD ON *.* TO 'replicator'@'10.77.0.%';"
in_guest mariadb-admin shutdown
wait $mariadbd_pid
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin
