"""VM fork (docs/fork.md) with real QEMU, PostgreSQL, HAProxy and namespaces:
a loaded PostgreSQL VM forked into two streaming replicas that serve reads
through HAProxy and match the parent at an equal LSN; a clone whose page
source dies fails loudly while the parent runs on; and a clone stays off
the LAN until it has its own identity. Each check has a negative control
showing it catches the small bug."""
import json
import os
import signal
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from remusdb import clone_identity, control, fork, guest_agent, paths, read_pool
from remusdb.lab import netns, vm
from remusdb.lab import workload
from pgbench_load import PgbenchLoad
from polling import wait_for

PARENT = "fpar"
PARENT_IP = f"{netns.SUBNET_PREFIX}.12"
CLIENT_SITE = netns.read_pool_site("client")  # the read pools run in the client host


@pytest.fixture(scope="module")
def parent(lab):
    for host in netns.VM_HOSTS:
        vm.ensure_daemon(host)
        for name in (PARENT, f"{PARENT}c1", f"{PARENT}c2"):
            vm.stop(name, host)
    vm.start(PARENT, "primary", ip=PARENT_IP, from_saved=True, wait_timeout=400)
    yield {"name": PARENT, "host": "primary", "ip": PARENT_IP}
    vm.stop(PARENT, "primary")


def release_fork(clones, parent=PARENT):
    fork.stop_clones(clones)
    try:
        fork.release(parent)
    except (fork.ForkError, control.ControlError):
        pass


def guest_sql(host, name, sql, timeout=120):
    """SQL as the postgres superuser inside the guest, through its agent."""
    qga = vm.vm_files(host, name)["qga"]
    r = guest_agent.run(qga, ["/bin/su", "postgres", "-c", f"psql -X -A -t -d bench -c \"{sql}\""],
                        timeout)
    assert r["exitcode"] == 0, r
    return r["out"].strip()


# Everything pgbench writes, as one digest per table (ordered, so any
# different, missing or extra row changes it).
CHECKSUM_SQL = ("SELECT (SELECT md5(string_agg(aid || ':' || abalance, ',' ORDER BY aid)) "
                "FROM pgbench_accounts) || '/' || "
                "(SELECT md5(string_agg(tid || ':' || tbalance, ',' ORDER BY tid)) "
                "FROM pgbench_tellers) || '/' || "
                "(SELECT md5(string_agg(bid || ':' || bbalance, ',' ORDER BY bid)) "
                "FROM pgbench_branches) || '/' || "
                "(SELECT count(*) || ':' || coalesce(sum(delta), 0) FROM pgbench_history)")


def replay_lsn(ip):
    return workload.psql(ip, "SELECT pg_last_wal_replay_lsn()")


def wait_replayed(ip, target, timeout=300):
    deadline = time.monotonic() + timeout
    while workload.psql(ip, f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn") != "t":
        assert time.monotonic() < deadline, f"{ip} did not replay up to {target}"
        time.sleep(0.2)


def in_parallel(*calls):
    """The results of calls (functions of no argument), run at once in
    threads: each asks another guest, and a checksum of the whole pgbench
    data takes seconds under TCG. The first exception is raised."""
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [f.result() for f in futures]


def replayed_checksum(ip, target):
    """The replica's CHECKSUM_SQL once it has replayed up to target."""
    wait_replayed(ip, target)
    return workload.psql(ip, CHECKSUM_SQL)


def test_fork_of_a_loaded_postgres_gives_two_consistent_read_replicas(parent):
    # The load runs from before the fork until the clones are checked,
    # however long the fork takes, and stops there (pgbench_load.py): the
    # clones then replay its WAL and serve the read pool without it.
    bench = PgbenchLoad(PARENT_IP, clients=4)
    clones = []
    try:
        bench.wait_connected()  # both pgbench streams are running
        fork_start = time.monotonic()
        report = fork.fork(PARENT, 2, hosts=["primary", "backup"], role="replica",
                           connect_via=netns.client_call,
                           on_registered=clones.append)
        fork_end = time.monotonic()
        clones = report["clones"]
        print(json.dumps({"marks": report["marks"], "clones": [
            {k: c[k] for k in ("name", "host", "ip", "running_s", "first_query_s")}
            for c in clones]}, indent=1))
        # Both clones are hot standbys of the parent, reachable at their own address.
        for c in clones:
            assert workload.psql(c["ip"], "SELECT pg_is_in_recovery()") == "t"
            assert workload.psql(c["ip"], "SELECT inet_server_addr()") == c["ip"]
        load = bench.finish()
        # The read pool: HAProxy (Debian's) over the two clones, in the client host.
        pool = read_pool.start("ftest", [(c["name"], c["ip"]) for c in clones],
                               site=CLIENT_SITE)
        try:
            read_pool.wait_up("ftest", [c["name"] for c in clones], site=CLIENT_SITE)
            served = set()
            for _ in range(6):
                served.add(workload.psql(pool["address"], "SELECT inet_server_addr()",
                                         port=pool["port"]))
            assert served == {c["ip"] for c in clones}, served
        finally:
            read_pool.stop("ftest", site=CLIENT_SITE)
        print(f"load: {load['runs']} pgbench runs, {load['transactions']} transactions, "
              f"longest idle {load['longest_idle_s']} s")
        # A verdict needs a load: pgbench ran on the parent through the fork.
        assert load["exit_code"] == 0, load["output"][-2000:]
        assert load["transactions"] and load["transactions"] > 0
        assert min(load["progress_tps"][5:15] or [0]) >= 0 and sum(load["progress_tps"]) > 0
        assert load["started"] < fork_start and load["ended"] > fork_end, load
        target = workload.psql(PARENT_IP, "SELECT pg_current_wal_lsn()")
        expected, *got = in_parallel(
            lambda: workload.psql(PARENT_IP, CHECKSUM_SQL),
            *[lambda ip=c["ip"]: replayed_checksum(ip, target) for c in clones])
        for c, checksum in zip(clones, got):
            assert checksum == expected, c["name"]
        # Negative control: one row updated on the parent while clone 1's
        # replay is paused must show as a difference.
        c1 = clones[0]
        guest_sql(c1["host"], c1["name"], "SELECT pg_wal_replay_pause()")
        workload.psql(PARENT_IP, "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = 1")
        changed, behind = in_parallel(lambda: workload.psql(PARENT_IP, CHECKSUM_SQL),
                                      lambda: workload.psql(c1["ip"], CHECKSUM_SQL))
        assert changed != expected
        assert behind == expected  # one row behind: caught
        guest_sql(c1["host"], c1["name"], "SELECT pg_wal_replay_resume()")
        wait_replayed(c1["ip"], workload.psql(PARENT_IP, "SELECT pg_current_wal_lsn()"))
        assert workload.psql(c1["ip"], CHECKSUM_SQL) == changed
    finally:
        bench.finish()
        release_fork(clones)


def clone_status(c):
    return control.request(paths.control_socket(c["host"]), "status", vm=c["name"])["vm"]


def kill_page_source(parent_host):
    f = fork.daemon_status(parent_host, PARENT)["fork"]
    assert f["pagesrc_running"], f
    os.kill(f["pagesrc_pid"], signal.SIGKILL)
    return f


def parent_still_serves():
    workload.psql(PARENT_IP, "CREATE TABLE IF NOT EXISTS fork_alive (t timestamptz)")
    workload.psql(PARENT_IP, "INSERT INTO fork_alive VALUES (now())")
    return int(workload.psql(PARENT_IP, "SELECT count(*) FROM fork_alive"))


def migration_status(files):
    """The clone's migration state; None once its QEMU is gone (the
    caller's running_pid check then says so)."""
    from remusdb.qmp import QMP, QMPError
    try:
        with QMP(files["qmp"]) as q:
            return q.command("query-migrate")["status"]
    except (OSError, QMPError):
        return None


UNWATCHED_S = 5


@pytest.mark.parametrize("watched", [True, False], ids=["watched", "control-unwatched"])
def test_a_clone_whose_page_source_dies_fails_loudly_and_the_parent_runs_on(parent, watched):
    """The page source is a process on the parent's host; SIGKILL is its
    crash. A slow background push (8 Mbit/s) keeps the clone depending on
    it. Watched, the clone fails within seconds; the control, registered
    without the watch, shows what the watch prevents: a clone stuck for good."""
    clones = fork.plan_clones(PARENT, 1, ["backup"])
    try:
        parent_host, meta, f = fork.snapshot(PARENT, 1, push_mbps=8)
        fork.launch(f, PARENT, parent_host, meta, clones, watched=watched)
        c = clones[0]
        time.sleep(2)
        served = fork.daemon_status(parent_host, PARENT)["fork"]["clones"][c["name"]]
        assert served["state"] == "sending", served  # still depends on its source
        kill_page_source(parent_host)
        killed = time.monotonic()
        files = vm.vm_files(c["host"], c["name"])
        deadline = killed + 15
        while time.monotonic() < deadline and vm.running_pid(files):
            if not watched and migration_status(files) == "postcopy-paused":
                break  # the state the watch acts on: the control watches on from here
            time.sleep(0.25)
        detected_s = time.monotonic() - killed
        if watched:
            assert not vm.running_pid(files), "the clone's QEMU still runs 15 s after its source died"
            st = clone_status(c)["clone"]
            assert st["state"] == "failed" and "page source" in st["error"], st
            print(f"clone failed {detected_s:.2f} s after its page source was killed: {st['error']}")
        else:
            # A watch would have failed the clone within one 250 ms poll of
            # postcopy-paused and a 1 s quit grace (clone_watch.c): UNWATCHED_S
            # is several times that, and nothing else ends the clone.
            time.sleep(UNWATCHED_S)
            assert vm.running_pid(files), "control: the unwatched clone should still exist"
            assert migration_status(files) == "postcopy-paused"
            with pytest.raises(guest_agent.GuestAgentError):
                guest_agent.run(files["qga"], ["/bin/true"], 5, agent_timeout=5)
        # The parent is untouched either way: it commits and its daemon says why the fork ended.
        assert parent_still_serves() >= 1
        fst = fork.daemon_status(parent_host, PARENT)["fork"]
        assert fst["state"] == "failed" and "page source exited" in fst["error"], fst
    finally:
        release_fork(clones)


class TapWatch:
    """Records the frames remusdbd's relay writes into a clone's tap (what the
    clone puts on the LAN), from before its QEMU starts: (time, source MAC,
    IPv4 source or ARP sender address, or None)."""

    ETH_P_ALL = 3
    PACKET_OUTGOING = 4

    def __init__(self, host, tap):
        self.frames = []
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self.run, args=(host, tap), daemon=True)
        self.thread.start()
        assert self.ready.wait(10)

    def run(self, host, tap):
        netns.enter(netns.namespace_of(host))  # this thread only
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(self.ETH_P_ALL))
        s.bind((tap, 0))
        s.settimeout(0.2)
        self.ready.set()
        while not self.stop.is_set():
            try:
                data, addr = s.recvfrom(65536)
            except socket.timeout:
                continue
            if addr[2] == self.PACKET_OUTGOING:  # the bridge's, towards the guest
                continue
            ethertype = struct.unpack("!H", data[12:14])[0]
            ip = None
            if ethertype == 0x0800 and len(data) >= 34:
                ip = socket.inet_ntoa(data[26:30])
            elif ethertype == 0x0806 and len(data) >= 42:
                ip = socket.inet_ntoa(data[28:32])
            self.frames.append((time.monotonic(), data[6:12].hex(":"), ip))
        s.close()

    def close(self):
        self.stop.set()
        self.thread.join()


@pytest.mark.parametrize("guarded", [True, False], ids=["quarantined", "control-unguarded"])
def test_a_clone_stays_off_the_lan_until_it_has_its_own_identity(parent, guarded):
    """From its first instruction the clone holds the parent's MAC, address
    and sessions. Quarantined, not one frame of it reaches the LAN except as
    its new identity (new MAC and new address), although it tried (the
    relay's drop count); the control shows the parent's MAC leaking."""
    parent_mac = vm.mac_for(PARENT)
    watches = {}
    clones = []

    def on_registered(c):
        clones.append(c)  # stopped below even if the fork fails
        watches[c["name"]] = TapWatch(c["host"], f"rdbt-{c['name']}")

    try:
        report = fork.fork(PARENT, 1, hosts=["backup"], role="replica", guarded=guarded,
                           on_registered=on_registered, connect_via=netns.client_call)
        clones = report["clones"]
        c = clones[0]
        time.sleep(3)
        w = watches[c["name"]]
        w.close()
        macs = {mac for _, mac, _ in w.frames}
        ips = {ip for _, _, ip in w.frames if ip}
        nic = clone_status(c)["nics"][0]
        print(f"frames from the clone on the LAN: {len(w.frames)}, source MACs {macs}, "
              f"addresses {ips}; dropped in quarantine: {nic['quarantine_dropped']}")
        if guarded:
            assert macs == {c["mac"]}, f"frames of another identity left the clone: {macs}"
            assert ips == {c["ip"]}, f"frames from another address left the clone: {ips}"
            # It did try to talk as the parent: the check was exercised.
            assert nic["quarantine_dropped"] > 0
            # Released is remembered: a restarted remusdbd does not cut it off again.
            vm.stop_daemon(c["host"])
            vm.ensure_daemon(c["host"])
            deadline = time.monotonic() + 30
            while not clone_status(c)["nics"][0]["connected"]:
                assert time.monotonic() < deadline, "the relay did not reconnect to the clone"
                time.sleep(0.2)
            assert clone_status(c)["nics"][0]["quarantine"] == "off"
            fork.first_query(c["ip"], timeout=60, connect_via=netns.client_call)
        else:
            # Control: unguarded, the clone speaks as the parent at once.
            assert parent_mac in macs or PARENT_IP in ips, (macs, ips)
    finally:
        for w in watches.values():
            w.close()
        release_fork(clones)


# ---------------------------------------------------------------- MariaDB
# A MariaDB parent forked into GTID replicas (docs/fork.md, "MariaDB").
# Its PostgreSQL is stopped: one DBMS runs, which fork detects, and the
# parent's one vCPU goes to MariaDB and the write load.

MPARENT = "fmpar"
MPARENT_IP = f"{netns.SUBNET_PREFIX}.13"
MTABLE = "fork_load"


def guest_mariadb(host, name, sql, timeout=120, names=False):
    """SQL as MariaDB's root (unix socket) inside the guest, through its agent
    (column names only with names=True: \\G output)."""
    qga = vm.vm_files(host, name)["qga"]
    r = guest_agent.run(qga, ["/usr/bin/mariadb"] + ([] if names else ["-N", "-B"]) +
                        ["-e", sql], timeout)
    assert r["exitcode"] == 0, r
    return r["out"].strip()


def mq(ip, sql, timeout=30):
    return fork.mariadb_query(ip, sql, timeout, user="bench", password="bench",
                              database="bench", connect_via=netns.client_call)


def table_digest(ip):
    """CHECKSUM TABLE and the row count: any different, missing or extra row
    changes the checksum."""
    return (mq(ip, f"CHECKSUM TABLE bench.{MTABLE}")[1], mq(ip, f"SELECT COUNT(*) FROM bench.{MTABLE}")[0])


def gtid_wait(ip, pos, timeout=300):
    start = time.monotonic()
    r = mq(ip, f"SELECT MASTER_GTID_WAIT('{pos}', {timeout})", timeout=timeout + 30)[0]
    assert r == 0, f"{ip} did not reach GTID {pos} within {timeout} s"
    return round(time.monotonic() - start, 2)


@pytest.fixture(scope="module")
def maria_parent(lab):
    # The PostgreSQL tests above are done by now (file order): their parent
    # would only take CPU from this one's clones under TCG.
    vm.stop(PARENT, "primary")
    for host in netns.VM_HOSTS:
        vm.ensure_daemon(host)
        for name in (MPARENT, f"{MPARENT}c1", f"{MPARENT}c2"):
            vm.stop(name, host)
    vm.start(MPARENT, "primary", ip=MPARENT_IP, from_saved=True, wait_timeout=400)
    qga = vm.vm_files("primary", MPARENT)["qga"]
    # The cluster's own unit as well as Debian's umbrella unit: one CI run
    # still found a postgres process after stopping the umbrella alone.
    # PostgreSQL stops first: MariaDB's start then has the one vCPU to itself.
    for cmd in (["systemctl", "stop", "postgresql", "postgresql@15-main"],
                ["systemctl", "start", "mariadb"]):
        r = guest_agent.run(qga, ["/usr/bin/" + cmd[0]] + cmd[1:], 300)
        assert r["exitcode"] == 0, r
    wait_for(lambda: guest_agent.run(qga, ["/usr/bin/pgrep", "-x", "postgres"], 30)["exitcode"]
             == 1, 60, "no postgres process left in the MariaDB parent")
    guest_mariadb("primary", MPARENT, f"CREATE TABLE bench.{MTABLE} (id INT AUTO_INCREMENT "
                  "PRIMARY KEY, worker INT NOT NULL, n INT NOT NULL, note VARCHAR(40)) ENGINE=InnoDB")
    yield {"name": MPARENT, "host": "primary", "ip": MPARENT_IP}
    vm.stop(MPARENT, "primary")


class MariaLoad:
    """Writers on the parent from the client host: each commits an INSERT and
    an UPDATE of its own first row per transaction, until stopped (by
    primary key: an UPDATE that scanned by `worker` took next-key locks
    across the workers' rows and deadlocked in a trial run)."""

    def __init__(self, ip, workers=4):
        import pymysql
        self.stop = threading.Event()
        self.commits = [0] * workers
        self.times = []  # monotonic time of every commit (list.append is atomic)
        self.errors = []
        self.conns = [netns.call_in("rdb-client", pymysql.connect, host=ip, user="bench",
                                    password="bench", database="bench", connect_timeout=10,
                                    read_timeout=60, autocommit=False) for _ in range(workers)]
        self.threads = [threading.Thread(target=self.work, args=(w,)) for w in range(workers)]
        for t in self.threads:
            t.start()

    def work(self, w):
        conn = self.conns[w]
        n = 0
        first = None
        try:
            while not self.stop.is_set():
                n += 1
                with conn.cursor() as cur:
                    cur.execute(f"INSERT INTO {MTABLE} (worker, n, note) VALUES (%s, %s, 'load')",
                                (w, n))
                    first = first or cur.lastrowid
                    cur.execute(f"UPDATE {MTABLE} SET n = n + 1 WHERE id = %s", (first,))
                conn.commit()
                self.commits[w] += 1
                self.times.append(time.monotonic())
        except Exception as e:  # reported by finish()
            self.errors.append(repr(e))
        finally:
            conn.close()

    def longest_gap(self, start, end):
        """The longest time without a commit between start and end (s)."""
        ts = [start] + sorted(t for t in self.times if start < t < end) + [end]
        return round(max(b - a for a, b in zip(ts, ts[1:])), 3)

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join()
        return sum(self.commits)


def test_fork_of_a_loaded_mariadb_gives_two_consistent_gtid_replicas(maria_parent):
    load = MariaLoad(MPARENT_IP)
    clones = []
    try:
        # Every writer is committing before the fork.
        wait_for(lambda: all(load.commits) or load.errors, 60, "a commit from every writer")
        assert not load.errors, load.errors
        before = sum(load.commits)
        fork_start = time.monotonic()
        report = fork.fork(MPARENT, 2, hosts=["primary", "backup"], role="replica",
                           connect_via=netns.client_call,
                           on_registered=clones.append)
        # BACKUP STAGE BLOCK_COMMIT is held across the snapshot: the parent's
        # writers stall for that long, and only that long.
        stall = load.longest_gap(fork_start, fork_start + report["marks"]["clones_serving"])
        clones = report["clones"]
        assert report["dbms"] == "mariadb"  # detected: the parent runs mariadbd only
        m = report["marks"]
        assert stall < m["commits_unblocked"] - m["commits_blocked"] + 5, (stall, m)
        during = sum(load.commits) - before
        # The writers stop once the fork is done: the clones replicate
        # what they committed, without more coming in.
        total = load.finish()
        print(json.dumps({"marks": report["marks"], "parent_pause_ms": report["fork"].get(
            "parent_pause_ms"), "commits_during_fork": during, "longest_commit_gap_s": stall,
            "clones": [
            {k: c[k] for k in ("name", "host", "ip", "server_id", "running_s", "identity_s",
                               "first_query_s")} for c in clones]}, indent=1))
        for c in clones:
            print(c["hook_output"])
            # Each clone is a read-only replica with its own server_id, at its own address.
            ro, sid = mq(c["ip"], "SELECT @@read_only, @@server_id")
            assert (ro, sid) == (1, clone_identity.server_id_for(c["ip"]))
            status = guest_mariadb(c["host"], c["name"], "SHOW SLAVE STATUS\\G", names=True)
            assert "Slave_IO_Running: Yes" in status and "Slave_SQL_Running: Yes" in status
            assert f"Master_Host: {MPARENT_IP}" in status and "Using_Gtid: Slave_Pos" in status
        # The read pool: HAProxy in TCP mode over the clones' 3306 (plain
        # connect check: HAProxy's mysql-check would need a password-less user).
        pool = read_pool.start("fmtest", [(c["name"], c["ip"], 3306) for c in clones],
                               port=3307, check="tcp", site=CLIENT_SITE)
        try:
            read_pool.wait_up("fmtest", [c["name"] for c in clones], site=CLIENT_SITE)
            served = set()
            import pymysql
            for _ in range(6):
                conn = netns.call_in("rdb-client", pymysql.connect, host=pool["address"],
                                     port=pool["port"], user="bench", password="bench",
                                     database="bench", connect_timeout=10)
                with conn.cursor() as cur:
                    cur.execute("SELECT @@server_id")
                    served.add(cur.fetchone()[0])
                conn.close()
            assert served == {c["server_id"] for c in clones}, served
        finally:
            read_pool.stop("fmtest", site=CLIENT_SITE)
        # A verdict needs a load: the writers committed through the fork.
        assert not load.errors, load.errors
        assert total > 0 and during > 0, (total, during)
        target = mq(MPARENT_IP, "SELECT @@GLOBAL.gtid_binlog_pos")[0]
        expected = table_digest(MPARENT_IP)
        for c in clones:
            waited = gtid_wait(c["ip"], target)
            got = table_digest(c["ip"])
            print(f"{c['name']}: at {target} after {waited} s; checksum, rows {got}")
            assert got == expected, (c["name"], got, expected)
        # Negative control: one row changed on the parent while clone 1's SQL
        # thread is stopped must show as a difference.
        c1 = clones[0]
        guest_mariadb(c1["host"], c1["name"], "STOP SLAVE SQL_THREAD")
        mq(MPARENT_IP, f"UPDATE {MTABLE} SET n = n + 1 WHERE id = 1")
        changed = table_digest(MPARENT_IP)
        assert changed != expected
        assert table_digest(c1["ip"]) == expected  # one row behind: caught
        guest_mariadb(c1["host"], c1["name"], "START SLAVE SQL_THREAD")
        gtid_wait(c1["ip"], mq(MPARENT_IP, "SELECT @@GLOBAL.gtid_binlog_pos")[0])
        assert table_digest(c1["ip"]) == changed
    finally:
        load.finish()
        fork.stop_clones(clones)
        try:
            fork.release(MPARENT)
        except (fork.ForkError, control.ControlError):
            pass


@pytest.mark.parametrize("checked", [True, False], ids=["checked", "control-unchecked"])
def test_a_mariadb_clone_with_one_commit_of_its_own_is_refused(maria_parent, checked):
    """The window: the clone's mariadbd runs on from the fork until the hook
    kills it. Here it commits one transaction of its own in that window
    (through its agent), and the parent one of the same size after the
    fork: the same GTID, other bytes. The binlog check refuses the clone
    with one line. The control, without the check, shows what it prevents:
    the clone replicates, reaches the parent's GTID position, and holds
    the other row for good (MASTER_GTID_WAIT is satisfied: silent)."""
    guest_mariadb("primary", MPARENT, "CREATE TABLE IF NOT EXISTS bench.fork_div "
                  "(id INT PRIMARY KEY, v CHAR(1)) ENGINE=InnoDB; DELETE FROM bench.fork_div")
    clones = fork.plan_clones(MPARENT, 1, ["backup"], ips=[f"{netns.SUBNET_PREFIX}.61"])
    c = clones[0]
    try:
        t0 = time.monotonic()
        parent_host, meta, f = fork.snapshot(MPARENT, 1)
        fork.launch(f, MPARENT, parent_host, meta, clones)
        guest_mariadb(c["host"], c["name"], "INSERT INTO bench.fork_div VALUES (1, 'c')")
        mq(MPARENT_IP, "INSERT INTO bench.fork_div VALUES (1, 'p')")
        if checked:
            with pytest.raises(clone_identity.CloneIdentityError) as e:
                fork.become(c, "replica", None, MPARENT, f["host"], MPARENT_IP, True, None,
                            t0, dbms="mariadb", parent_host=parent_host,
                            connect_via=netns.client_call)
            msg = str(e.value)
            print(msg)
            assert "\n" not in msg
            assert msg.startswith("the clone's binlog diverged from the parent's at mariadb-bin.")
            # Same size, other bytes: caught by the hash, not by a length.
            assert "within its first" in msg and msg.endswith("; fork again")
            # Refused before START SLAVE: the clone replicates nothing.
            status = guest_mariadb(c["host"], c["name"], "SHOW SLAVE STATUS\\G", names=True)
            assert "Slave_IO_Running: No" in status and "Slave_SQL_Running: No" in status
        else:
            fork.become(c, "replica", None, MPARENT, f["host"], MPARENT_IP, True, None, t0,
                        dbms="mariadb", check_divergence=False, parent_host=parent_host,
                        connect_via=netns.client_call)
            mq(MPARENT_IP, "INSERT INTO bench.fork_div VALUES (2, 'p')")
            gtid_wait(c["ip"], mq(MPARENT_IP, "SELECT @@GLOBAL.gtid_binlog_pos")[0], 120)
            # Caught up by GTID, yet row 1 is the clone's own: diverged, silently.
            assert mq(c["ip"], "SELECT GROUP_CONCAT(v ORDER BY id) FROM bench.fork_div")[0] == "c,p"
            assert mq(MPARENT_IP, "SELECT GROUP_CONCAT(v ORDER BY id) FROM bench.fork_div")[0] == "p,p"
    finally:
        release_fork(clones, MPARENT)


def test_a_mariadb_copy_is_an_independent_primary(maria_parent):
    """Role copy: a new server_id, read-write, no replication; its binlog
    goes on from the parent's position with GTIDs of its own server id."""
    clones = []
    try:
        report = fork.fork(MPARENT, 1, hosts=["backup"], role="copy", dbms="mariadb",
                           ips=[f"{netns.SUBNET_PREFIX}.71"], connect_via=netns.client_call,
                           on_registered=clones.append)
        clones = report["clones"]
        c = clones[0]
        sid = clone_identity.server_id_for(c["ip"])
        assert mq(c["ip"], "SELECT @@read_only, @@server_id") == (0, sid)
        assert guest_mariadb(c["host"], c["name"], "SHOW SLAVE STATUS") == ""
        mq(c["ip"], "CREATE TABLE IF NOT EXISTS bench.fork_copy (id INT PRIMARY KEY)")
        mq(c["ip"], "INSERT INTO bench.fork_copy VALUES (1)")
        assert f"0-{sid}-" in mq(c["ip"], "SELECT @@GLOBAL.gtid_binlog_pos")[0]
        assert mq(MPARENT_IP, "SELECT COUNT(*) FROM information_schema.tables WHERE "
                              "table_schema = 'bench' AND table_name = 'fork_copy'")[0] == 0
    finally:
        release_fork(clones, MPARENT)
