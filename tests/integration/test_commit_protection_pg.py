"""The patched PostgreSQL in a real guest under commit protection (issue 10,
dbms-patches/postgresql-15): with the VM protected with
`--commit-protection` at 100 ms, a client in the lab's client namespace
times each kind of reply.

- Simple protocol (psycopg2): an autocommit INSERT's reply and an explicit
  COMMIT's wait for their epoch; a SELECT's, a BEGIN's and an INSERT's
  inside the open transaction come back at once.
- Extended protocol (pgbench -M prepared, Parse/Bind/Execute/Sync): the
  same for an autocommit INSERT and a SELECT.
- The relay counts the commit replies as marked frames held.

The control: with remusdb_commit_protection off (a reload, as the GUC is
SIGHUP), the same run shows commit replies coming back at once and no
marked frame held, and the judgement used above (cp_dbms.not_held)
reports it."""
import re
import subprocess
import tempfile
import textwrap
import time

import pytest
from conftest import fresh_guest

import cp_dbms
from remusdb.lab import vm, workload

NAME = "cppg"
N = 20

CLIENT = textwrap.dedent("""
    import json, sys, time
    import psycopg2
    ip, n = sys.argv[1], int(sys.argv[2])
    c = psycopg2.connect(host=ip, user="bench", password="bench", dbname="bench",
                         connect_timeout=10)
    c.autocommit = True
    cur = c.cursor()
    cur.execute("CREATE TABLE IF NOT EXISTS cp_probe (id serial PRIMARY KEY, note text)")
    cur.execute("SHOW remusdb_commit_protection")
    guc = cur.fetchone()[0]
    lat = {k: [] for k in ("insert", "select", "begin", "in_txn", "commit")}
    def timed(kind, sql):
        start = time.monotonic()
        cur.execute(sql)
        lat[kind].append(round((time.monotonic() - start) * 1000, 2))
    for i in range(n):
        timed("insert", "INSERT INTO cp_probe (note) VALUES ('autocommit')")
        timed("select", "SELECT count(*) FROM cp_probe")
        timed("begin", "BEGIN")
        timed("in_txn", "INSERT INTO cp_probe (note) VALUES ('in a transaction')")
        timed("commit", "COMMIT")
    c.close()
    print(json.dumps({"guc": guc, "latency_ms": lat}))
""")

PGBENCH_SCRIPT = """\
INSERT INTO cp_probe (note) VALUES ('extended protocol');
SELECT count(*) FROM cp_probe;
"""


def extended_protocol():
    """pgbench -M prepared: per-statement average latencies (ms)."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as f:
        f.write(PGBENCH_SCRIPT)
        f.flush()
        r = subprocess.run(["ip", "netns", "exec", workload.CLIENT_NS, "pgbench",
                            "-h", vm.DEFAULT_IP, "-U", workload.DB_USER, "-n",
                            "-M", "prepared", "-r", "-t", str(N), "-f", f.name,
                            workload.DB_NAME],
                           env=workload.PG_ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lat = {}
    for line in r.stdout.splitlines():
        m = re.match(r"\s*([0-9.]+)\s+.*\b(INSERT|SELECT)\b", line)
        if m:
            lat["ext_" + m.group(2).lower()] = float(m.group(1))
    assert set(lat) == {"ext_insert", "ext_select"}, r.stdout
    return lat


def measure():
    result = cp_dbms.run_client(CLIENT, vm.DEFAULT_IP, N)
    ext = extended_protocol()
    # pgbench reports averages: one value per series.
    result["latency_ms"].update({k: [v] for k, v in ext.items()})
    return result


COMMITS = ("insert", "commit", "ext_insert")
OTHERS = ("select", "begin", "in_txn", "ext_select")


def show_guc(name):
    s = cp_dbms.guest_run(name, ["/usr/bin/su", "postgres", "-c",
                                 "psql -XAtc 'SHOW remusdb_commit_protection'"])
    assert s["exitcode"] == 0, s
    return s["out"].strip()


def set_guc(name, value):
    """ALTER SYSTEM and a reload (the GUC is SIGHUP); returns once a new
    session sees the value, as the postmaster rereads its files
    asynchronously."""
    sql = f"ALTER SYSTEM SET remusdb_commit_protection = {value}"
    s = cp_dbms.guest_run(name, ["/usr/bin/su", "postgres", "-c",
                                 f"psql -qc '{sql}' -c 'SELECT pg_reload_conf()'"])
    assert s["exitcode"] == 0, s
    deadline = time.monotonic() + 30
    while show_guc(name) != value:
        assert time.monotonic() < deadline, f"remusdb_commit_protection is not {value} after a reload"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def guest(lab):
    with fresh_guest(NAME) as name:
        yield name


def test_the_guc_is_there_and_on_in_the_guest(guest):
    assert show_guc(guest) == "on"
    # The module the patch talks to is loaded.
    s = cp_dbms.guest_run(guest, ["/usr/bin/cat", "/sys/kernel/remusdb_cp/dscp"])
    assert s["exitcode"] == 0 and s["out"].strip() == "47", s


def test_commit_replies_wait_for_their_epoch_and_the_rest_leave_at_once(guest):
    r = cp_dbms.protected_run(guest, measure)
    assert r["guc"] == "on"
    # Every autocommit INSERT and COMMIT of the simple protocol, and the
    # extended protocol's inserts: at least one marked frame each.
    why = cp_dbms.not_held(r, COMMITS, OTHERS, min_held_frames=3 * N)
    assert why == [], why
    assert r["relay"]["marked_dropped"] == 0 and r["relay"]["flow_table_failures"] == 0


def test_control_with_the_guc_off_commit_replies_are_not_held(guest):
    set_guc(guest, "off")
    try:
        r = cp_dbms.protected_run(guest, measure)
    finally:
        set_guc(guest, "on")
    assert r["guc"] == "off"
    assert r["relay"]["marked_held"] == 0, r["relay"]
    why = cp_dbms.not_held(r, COMMITS, OTHERS, min_held_frames=3 * N)
    # The judgement catches every commit series coming back at once.
    for k in COMMITS:
        assert any(w.startswith(f"{k} replies") for w in why), why
