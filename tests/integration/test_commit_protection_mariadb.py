"""The patched MariaDB in a real guest under commit protection (issue 10,
dbms-patches/mariadb-10.11). MariaDB is installed but not started at boot;
the guest agent starts it. With the VM protected with
`--commit-protection` at 100 ms, a client in the lab's client namespace
(PyMySQL, autocommit on) times each kind of reply: an autocommit INSERT's
OK and an explicit COMMIT's wait for their epoch; a SELECT's, a BEGIN's and
an INSERT's inside the open transaction come back at once; the relay
counts the commit replies as marked frames held.

The control: with remusdb_commit_protection OFF (SET GLOBAL), the same run
shows commit replies coming back at once and no marked frame held, and
the judgement used above (cp_dbms.not_held) reports it."""
import textwrap

import pytest
from conftest import fresh_guest

import cp_dbms
from remusdb.lab import vm

NAME = "cpmaria"
N = 20

CLIENT = textwrap.dedent("""
    import json, sys, time
    import pymysql
    ip, n = sys.argv[1], int(sys.argv[2])
    c = pymysql.connect(host=ip, user="bench", password="bench", database="bench",
                        connect_timeout=10, autocommit=True)
    cur = c.cursor()
    cur.execute("CREATE TABLE IF NOT EXISTS cp_probe (id INT AUTO_INCREMENT PRIMARY KEY, "
                "note VARCHAR(40)) ENGINE=InnoDB")
    cur.execute("SELECT @@global.remusdb_commit_protection")
    var = cur.fetchone()[0]
    lat = {k: [] for k in ("insert", "select", "begin", "in_txn", "commit")}
    def timed(kind, sql):
        start = time.monotonic()
        cur.execute(sql)
        cur.fetchall()
        lat[kind].append(round((time.monotonic() - start) * 1000, 2))
    for i in range(n):
        timed("insert", "INSERT INTO cp_probe (note) VALUES ('autocommit')")
        timed("select", "SELECT count(*) FROM cp_probe")
        timed("begin", "BEGIN")
        timed("in_txn", "INSERT INTO cp_probe (note) VALUES ('in a transaction')")
        timed("commit", "COMMIT")
    c.close()
    print(json.dumps({"variable": var, "latency_ms": lat}))
""")

COMMITS = ("insert", "commit")
OTHERS = ("select", "begin", "in_txn")


def mariadb(name, sql):
    s = cp_dbms.guest_run(name, ["/usr/bin/mariadb", "-N", "-B", "-e", sql])
    assert s["exitcode"] == 0, s
    return s["out"].strip()


def measure():
    return cp_dbms.run_client(CLIENT, vm.DEFAULT_IP, N)


@pytest.fixture(scope="module")
def guest(lab):
    with fresh_guest(NAME) as name:
        s = cp_dbms.guest_run(name, ["/usr/bin/systemctl", "start", "mariadb"], timeout=300)
        assert s["exitcode"] == 0, s
        # systemd waits for the server's readiness notification.
        assert mariadb(name, "SELECT 1") == "1"
        yield name


def test_the_variable_is_there_and_on_in_the_guest(guest):
    assert mariadb(guest, "SELECT @@global.remusdb_commit_protection") == "1"
    # The server is the patched build, beside Debian's diverted binary.
    s = cp_dbms.guest_run(guest, ["/usr/bin/test", "-x", "/usr/sbin/mariadbd.debian"])
    assert s["exitcode"] == 0, s


def test_commit_replies_wait_for_their_epoch_and_the_rest_leave_at_once(guest):
    r = cp_dbms.protected_run(guest, measure)
    assert r["variable"] == 1
    why = cp_dbms.not_held(r, COMMITS, OTHERS, min_held_frames=2 * N)
    assert why == [], why
    assert r["relay"]["marked_dropped"] == 0 and r["relay"]["flow_table_failures"] == 0


def test_control_with_the_variable_off_commit_replies_are_not_held(guest):
    mariadb(guest, "SET GLOBAL remusdb_commit_protection = OFF")
    try:
        r = cp_dbms.protected_run(guest, measure)
    finally:
        mariadb(guest, "SET GLOBAL remusdb_commit_protection = ON")
    assert r["variable"] == 0
    assert r["relay"]["marked_held"] == 0, r["relay"]
    why = cp_dbms.not_held(r, COMMITS, OTHERS, min_held_frames=2 * N)
    for k in COMMITS:
        assert any(w.startswith(f"{k} replies") for w in why), why
