"""What a drill asks the database and the guest afterwards, from the
client host and always under a timeout: the ledger's rows, pg_amcheck,
the load's backends in pg_stat_activity, and the guest's console."""
import re
import subprocess
import time

from .. import paths
from ..lab import workload
from .lab import say
from .survival import SNAPSHOT_SQL, parse_snapshot

PSQL_TIMEOUT_S = 30
AMCHECK_TIMEOUT_S = 900
SNAPSHOT_TIMEOUT_S = 10


def run_client(args, timeout):
    """A client command in rdb-client with a hard timeout: (exit code or
    None on timeout, stdout + stderr, stdout)."""
    try:
        r = subprocess.run(["ip", "netns", "exec", workload.CLIENT_NS, *args],
                           env=dict(workload.PG_ENV, PGCONNECT_TIMEOUT="5"),
                           capture_output=True, text=True, timeout=timeout)
        return r.returncode, (r.stdout + r.stderr).strip(), r.stdout
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s", ""


def ledger_ids_in_db(ip, tries=5):
    """Every id in the ledger table, or None when the database does not
    answer (retried: right after a takeover it may still be settling)."""
    sql = "SELECT id FROM ledger"
    for attempt in range(tries):
        rc, text, stdout = run_client(["psql", "-h", ip, "-U", workload.DB_USER, "-d",
                                       workload.DB_NAME, "-X", "-A", "-t", "-v",
                                       "ON_ERROR_STOP=1", "-c", sql], PSQL_TIMEOUT_S)
        if rc == 0:
            return {int(x) for x in stdout.split()}
        last = attempt + 1 == tries
        say(f"reading the ledger table failed ({text}); {'giving up' if last else 'retrying'}")
        if not last:
            time.sleep(3)
    return None


def amcheck(ip):
    """pg_amcheck (heap + btree, --heapallindexed) over the bench database."""
    rc, text, _ = run_client([workload.PG_AMCHECK, "-h", ip, "-U", workload.DB_USER,
                              "--heapallindexed", workload.DB_NAME], AMCHECK_TIMEOUT_S)
    return rc == 0, text


GUEST_ERROR_RE = re.compile(r"\bBUG:|Oops:|Kernel panic|general protection fault")
# A guest starved of CPU (TCG on a busy 2-core host) reports soft lockups:
# a scheduling symptom, not corrupted memory, so it does not fail a drill.
GUEST_STALL_RE = re.compile(r"soft lockup")


def guest_kernel_errors(host, name, limit=20):
    """Kernel errors on the VM's serial console on `host`: a restored
    guest with inconsistent memory says so there (e.g. "BUG: Bad page
    map") long before the database stops answering."""
    console = paths.vm_run_dir(host, name) / "console.log"
    try:
        text = console.read_text(errors="replace")
    except OSError:
        return []
    return [line.strip() for line in text.splitlines()
            if GUEST_ERROR_RE.search(line) and not GUEST_STALL_RE.search(line)][:limit]


def activity_snapshot(ip, deadline=None):
    """The load's backends in pg_stat_activity (survival.SNAPSHOT_SQL)
    as (rows, raw text), retried every second until `deadline` (unix time;
    None: one try). Rows are None when the database never answered."""
    text = ""
    while True:
        rc, text, stdout = run_client(["psql", "-h", ip, "-U", workload.DB_USER, "-d",
                                       workload.DB_NAME, "-X", "-A", "-t", "-v",
                                       "ON_ERROR_STOP=1", "-c", SNAPSHOT_SQL],
                                      SNAPSHOT_TIMEOUT_S)
        if rc == 0:
            try:
                return parse_snapshot(stdout), stdout
            except ValueError as e:
                text = f"unreadable pg_stat_activity snapshot: {e}: {stdout[:200]}"
        if deadline is None or time.time() + 1 >= deadline:
            say(f"pg_stat_activity snapshot failed: {text}")
            return None, text
        say(f"pg_stat_activity snapshot: no answer yet ({text[:200]}); trying again")
        time.sleep(1)

