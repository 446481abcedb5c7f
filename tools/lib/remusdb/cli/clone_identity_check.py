"""clone-identity-check: exercises the guest hook remusdb-clone-identity
without the fork machinery (docs/fork.md, "Testing without a fork").
Needs the lab up (tools/remusdb-lab up); run it under the lab lock:

    flock /run/remusdb-lab.lock tools/dev/clone-identity-check [--keep]

1. identity: VM `cidp` boots at 10.77.0.60; the hook gives it a new MAC,
   10.77.0.61/24 and hostname db-id; from rdb-client the new address answers
   pg_isready and the old one does not; `ip link` in the guest shows the MAC.
2. replica: on cidp (now the parent at .61) rows are inserted, then
   pg_backup_start; more rows; the VM is paused (QMP stop), its disk file
   copied (cp --sparse=always), resumed (cont); more rows; pg_backup_stop
   gives the label; more rows.  The copy boots as VM `cidc` at 10.77.0.62
   (crash recovery, then it runs as a primary of its own: diverged WAL, and
   a row inserted on it on purpose), then the hook with --role replica.
   Checked: hot standby, replays up to the parent's LSN, has every parent
   row and not the diverged one, sees a row inserted afterwards, the
   parent lists it in pg_stat_replication; the recovery's log lines.
3. read pool: HAProxy in rdb-client on :5433 over the standby; a query
   through it reaches the standby (pg_is_in_recovery() = true).
Both VMs run with --disk file (the copy is taken from the file QEMU writes).
The script runs itself in rdb-client (psycopg2 reaches the guests there).
"""
import argparse
import os
import subprocess
import sys
import time

from .. import clone_identity as ci
from .. import guest_agent, output, paths, read_pool
from ..lab import cluster_file, netns, vm
from ..qmp import QMP

PARENT, CLONE = "cidp", "cidc"
# Away from vm.DEFAULT_IP (.10), which other engineers' VMs use.
PARENT_IP, PARENT_NEW_IP, CLONE_IP = "10.77.0.60", "10.77.0.61", "10.77.0.62"
NEW_MAC = "52:54:00:c1:d0:01"
T0 = time.monotonic()


def say(msg):
    """A progress line named by the seconds since the check began."""
    output.say(f"{time.monotonic() - T0:6.1f}s", msg)


def check(cond, what):
    say(("PASS " if cond else "FAIL ") + what)
    if not cond:
        raise SystemExit(1)


def connect(ip, dbname="bench"):
    import psycopg2
    c = psycopg2.connect(host=ip, user="bench", password="bench", dbname=dbname,
                         connect_timeout=10)
    c.autocommit = True
    return c


def q(conn, sql, *args):
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchall() if cur.description else None


def guest(vm_name, *argv, timeout=30):
    s = guest_agent.run(ci.qga_path("primary", vm_name), list(argv), timeout)
    return s["out"]


def pg_isready(ip):
    return subprocess.run(["pg_isready", "-q", "-h", ip, "-t", "3"]).returncode == 0


def insert(conn, phase, n=5):
    q(conn, "INSERT INTO fork_probe (phase) SELECT %s FROM generate_series(1, %s)", phase, n)


def phases(conn):
    return dict(q(conn, "SELECT phase, count(*) FROM fork_probe GROUP BY phase"))


def identity_step():
    vm.start(PARENT, "primary", ip=PARENT_IP, disk_via="file", fresh=True, wait_timeout=400)
    qga = ci.qga_path("primary", PARENT)
    old_mac = vm.mac_for(PARENT)
    ci.connect_agent(qga, wait=120).close()
    say(f"{PARENT} up at {PARENT_IP}, mac {old_mac}; hostname {guest(PARENT, '/bin/hostname').strip()}")
    out = ci.set_identity(qga, mac=NEW_MAC, ip=PARENT_NEW_IP, hostname="db-id")
    say(f"hook: {out.strip()}")
    link = guest(PARENT, "/sbin/ip", "-o", "link", "show", "eth0")
    addr = guest(PARENT, "/sbin/ip", "-o", "-4", "addr", "show", "eth0")
    check(NEW_MAC in link, f"guest eth0 has the new MAC: {link.split('link/ether')[1].split()[0]}")
    check(f"{PARENT_NEW_IP}/24" in addr and f"{PARENT_IP}/" not in addr,
          f"guest eth0 has only the new address: {addr.split()[3]}")
    check(guest(PARENT, "/bin/hostname").strip() == "db-id", "hostname is db-id")
    check(guest(PARENT, "/bin/cat", "/etc/hostname").strip() == "db-id", "/etc/hostname is db-id")
    check(pg_isready(PARENT_NEW_IP), f"pg_isready {PARENT_NEW_IP} from rdb-client answers")
    check(not pg_isready(PARENT_IP), f"pg_isready {PARENT_IP} from rdb-client does not")
    try:
        ci.set_identity(qga, mac="01:00:5e:00:00:01")
        check(False, "a multicast MAC is refused")
    except ci.CloneIdentityError as e:
        check("multicast" in str(e), f"a bad MAC is refused with a clear error: {e}")


def replica_step():
    parent = connect(PARENT_NEW_IP)
    q(parent, "CREATE TABLE fork_probe (id serial PRIMARY KEY, phase text NOT NULL, "
              "at timestamptz DEFAULT now())")
    insert(parent, "1-before-backup-start")
    bconn = ci.parent_connection(PARENT_NEW_IP, cluster_file.DB_USER, cluster_file.DB_PASSWORD)
    start_lsn = ci.backup_start(bconn)
    say(f"pg_backup_start: {start_lsn}")
    insert(parent, "2-before-snapshot")
    files = vm.vm_files("primary", PARENT)
    src, dst = paths.vm_disk(PARENT), paths.vm_disk(CLONE)
    with QMP(files["qmp"], timeout=10) as m:
        m.command("stop")
        t = time.monotonic()
        subprocess.run(["cp", "--sparse=always", str(src), str(dst) + ".tmp"], check=True)
        os.replace(str(dst) + ".tmp", dst)
        m.command("cont")
    say(f"snapshot: parent paused {time.monotonic() - t:.1f} s while its disk was copied")
    insert(parent, "3-after-snapshot")
    label = ci.backup_stop(bconn)
    bconn.close()
    say("pg_backup_stop label:\n    " + label.strip().replace("\n", "\n    "))
    insert(parent, "4-after-backup-stop")

    vm.start(CLONE, "primary", ip=CLONE_IP, disk_via="file", fresh=False, wait_timeout=400)
    ci.connect_agent(ci.qga_path("primary", CLONE), wait=120).close()
    clone = connect(CLONE_IP)
    check(q(clone, "SELECT pg_is_in_recovery()")[0][0] is False,
          "the copy first runs as a primary of its own (diverged)")
    insert(clone, "X-diverged-on-clone", 3)
    say(f"copy's own rows before the hook: {phases(clone)}")
    clone.close()

    t = time.monotonic()
    out = ci.make_replica(ci.qga_path("primary", CLONE), label, primary_host=PARENT_NEW_IP,
                          repl_user=cluster_file.DB_USER,
                          repl_password=cluster_file.DB_PASSWORD,
                          ip=CLONE_IP, hostname="db-c1", timeout=600)
    say(f"hook ({time.monotonic() - t:.1f} s): {out.strip()}")
    standby = connect(CLONE_IP)
    check(q(standby, "SELECT pg_is_in_recovery()")[0][0] is True, "clone is in recovery")
    check(q(standby, "SHOW transaction_read_only")[0][0] == "on", "clone accepts read-only sessions")
    target, replayed = ci.wait_replica_caught_up(standby, parent, timeout=300)
    check(True, f"clone replayed {replayed} >= parent's {target}")
    p, s = phases(parent), phases(standby)
    say(f"parent rows {p}; clone rows {s}")
    check(s == p, "clone has exactly the parent's rows (the diverged row is gone)")
    insert(parent, "5-after-replica", 1)
    target, replayed = ci.wait_replica_caught_up(standby, parent, timeout=120)
    check(phases(standby).get("5-after-replica") == 1, "a row inserted now reaches the clone")
    # bench may not see pg_stat_replication's details: read it as postgres
    rep = guest(PARENT, "/usr/sbin/runuser", "-u", "postgres", "--", "/usr/bin/psql", "-XAtc",
                "SELECT application_name, state, client_addr FROM pg_stat_replication").strip()
    check(f"db-c1|streaming|{CLONE_IP}" in rep.splitlines(),
          f"parent's pg_stat_replication: {rep}")
    sysid = {n: q(c, "SELECT system_identifier::text FROM pg_control_system()")[0][0]
             for n, c in (("parent", parent), ("clone", standby))}
    check(sysid["parent"] == sysid["clone"], f"same system_identifier {sysid['parent']}")
    s = guest_agent.run(ci.qga_path("primary", CLONE), [
        "/bin/sh", "-c", "ls -l /var/log/postgresql; grep -ahE "
        "'backup_label|redo starts|redo done|consistent recovery|started streaming|"
        "ready to accept read|database system was' /var/log/postgresql/*.log | tail -n 12"], 30)
    log = s["out"] + s["err"]
    say("clone's server log:\n    " + "\n    ".join(log.strip().splitlines()))
    redo = [ln.split(": ", 1)[1].split()[0] for ln in label.splitlines()
            if ln.startswith("START WAL LOCATION")][0]
    lines = log.splitlines()
    last = max(i for i, ln in enumerate(lines) if "database system was" in ln)
    check(any(f"redo starts at {redo}" in ln for ln in lines[last:]),
          f"the standby's redo starts at the label's START WAL LOCATION {redo}")
    last_state = lines[last]
    check("shut down" not in last_state,
          f"the hook's stop was immediate (no shutdown checkpoint): {last_state.split('LOG:')[1].strip()}")
    standby.close()
    parent.close()


def read_pool_step():
    site = netns.read_pool_site("client")  # this run's client host
    pool = read_pool.start("cidpool", [("c1", CLONE_IP)], site=site)
    try:
        states = read_pool.wait_up("cidpool", ["c1"], site=site, timeout=30)
        say(f"haproxy pid {pool['pid']} on {pool['address']}:{pool['port']}: {states}")
        import psycopg2
        c = psycopg2.connect(host=pool["address"], port=pool["port"], user="bench",
                             password="bench", dbname="bench", connect_timeout=10)
        r = q(c, "SELECT pg_is_in_recovery(), host(inet_server_addr())")[0]
        c.close()
        check(r == (True, CLONE_IP), f"a session through the pool lands on the standby: {r}")
    finally:
        read_pool.stop("cidpool", site=site)


def copy_step():
    """Role copy on the parent (a primary; the standby is done with)."""
    parent = connect(PARENT_NEW_IP)
    before = q(parent, "SELECT system_identifier::text FROM pg_control_system()")[0][0]
    p = phases(parent)
    parent.close()
    out = ci.make_copy(ci.qga_path("primary", PARENT), hostname="db-cp", timeout=300)
    say(f"hook: {out.strip()}")
    c = connect(PARENT_NEW_IP)
    after = q(c, "SELECT system_identifier::text FROM pg_control_system()")[0][0]
    check(after != before, f"system_identifier {before} -> {after}")
    check(q(c, "SELECT pg_is_in_recovery()")[0][0] is False, "the copy is a primary")
    check(phases(c) == p, "the copy kept its rows")
    insert(c, "6-written-on-copy", 1)
    check(phases(c).get("6-written-on-copy") == 1, "the copy takes writes")
    cd = guest(PARENT, "/usr/lib/postgresql/15/bin/pg_controldata", "/var/lib/postgresql/15/main")
    check(f"Database system identifier:           {after}" in cd and "CRC" not in cd,
          "pg_controldata shows it, no CRC warning")
    c.close()


def main():
    ap = argparse.ArgumentParser(prog="clone-identity-check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", action="store_true", help="leave the VMs running")
    ap.add_argument("--skip", action="append", default=[], choices=["pool"])
    args = ap.parse_args()
    if os.environ.get("CID_IN_CLIENT_NS") != "1":
        if not netns.is_up():
            raise SystemExit("the lab is down: tools/remusdb-lab up")
        env = dict(os.environ, CID_IN_CLIENT_NS="1")
        # the checkout's wrapper set PYTHONPATH, which env carries along
        os.execvpe("ip", ["ip", "netns", "exec", "rdb-client", sys.executable, "-m",
                          "remusdb.cli.clone_identity_check", *sys.argv[1:]], env)
    try:
        identity_step()
        replica_step()
        if "pool" not in args.skip:
            read_pool_step()
        copy_step()
        say("all checks passed")
    finally:
        if not args.keep:
            for name in (CLONE, PARENT):
                vm.stop(name, "primary")
                paths.vm_disk(name).unlink(missing_ok=True)


if __name__ == "__main__":
    main()
