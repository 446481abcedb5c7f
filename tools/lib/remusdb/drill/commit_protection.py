"""The commit-protection drill (issue 10): RemusDB's two lemmas under a real
power cut of the primary host.

A fresh guest runs PostgreSQL or MariaDB, protected with
--commit-protection. From the client host, txclient.py runs explicit
multi-statement transactions on 8 connections with think times of up to
half an epoch and, for PostgreSQL, the commit ledger runs autocommit
inserts on 4 more (ledger.py).
The primary loses power in the middle, right after a client saw a commit
acknowledged (inject.py: no FIN, no RST; the backup learns of it
from missing heartbeats), the backup takes over,
and the load goes on against it until its planned end. Then:
- Lemma 3.5.1 (fail-safe commit): every acknowledged commit, ledger's
  and txclient's, is in the database the backup runs;
- Lemma 3.5.2 (speculation): no transaction that broke before its COMMIT
  was sent is committed, although its clients saw its statements'
  results before the failure; none is committed in part;
- what the backup reset (its status) and when the clients saw it.

The verdict needs a real load: commits acknowledged before and after the
failure, and at least one transaction interrupted after its client saw
results (else Lemma 3.5.2 was not exercised, and the run counts as not
exercised, never as passed).

dbms_commit_protection=False turns the DBMS patch off through its switch
(remusdb_commit_protection / remusdb_commit_protection) while the relay
stays in commit-protection mode: the negative control, in which commit
acknowledgements leave speculatively and a failover can lose them.

Where the cut falls (cut=): "after-result" (the default), right after a
client saw a statement's result that followed a commit acknowledgement
and was not its transaction's last;
"after-ack", right after a client saw a commit acknowledged, at whatever
point of the epoch that is; or "mid-epoch", right after an
acknowledgement seen a quarter interval after the primary sent epoch E.

after-result is the cut that exercises Lemma 3.5.2: the case it needs
(results seen, COMMIT not sent, the results in no checkpoint the backup
has) exists only between the last committed cut and the power cut.
Acknowledgements leave in bursts when a checkpoint commits, and the
clients whose commits they were then begin new transactions, whose
first results come 20-45 ms later; a cut right after an acknowledgement
mostly falls before any of them. In CI's run of 2026-11-27 20:18, eight
after-ack drills in a row broke no transaction after its results were
seen (6 to 8 of the 8 connections went through each failover, 0 lost); a result
seen after an acknowledgement was produced after that acknowledgement's
checkpoint was cut, and the cut comes while it is still speculative.

mid-epoch, with an interval of hundreds of ms, makes the negative
control's loss certain rather than likely: the guest is then well into
epoch E+1, which the primary has not even cut when the power goes
(epoch_sent_before_cut is E, and the backup's committed_epoch shows it
got no later one), so every commit acknowledged in it is gone from the
backup. At 50 ms, after-ack cuts lost an acknowledged commit in 6 of 13
control drills (the suite's runs of 2026-11-26: the acknowledgement and
the cut are tens of ms apart, an epoch or so, and the commit's
checkpoint often reached the backup in between), so the control took up
to four drills. All cuts are judged the same way."""
import json
import random
import subprocess
import time
from functools import partial
from pathlib import Path

from .. import guest_agent, output, protection
from ..lab import vm, workload
from .inject import Injection
from .lab import forget_ownership, stop_vm_everywhere
from .txclient import judge, read_events

NAME = "cpdrill"
BACKUP = "10.77.0.2:7788"
STEPS = 3
TXCLIENT = Path(__file__).resolve().parent / "txclient.py"

# Runs in the client namespace: prints {tx: [steps]} of the drill table.
ROWS = r"""
import json, sys
dbms, host = sys.argv[1], sys.argv[2]
if dbms == "postgres":
    import psycopg2
    conn = psycopg2.connect(host=host, user="bench", dbname="bench", password="bench",
                            connect_timeout=10)
else:
    import pymysql
    conn = pymysql.connect(host=host, user="bench", password="bench", database="bench",
                           connect_timeout=10)
cur = conn.cursor()
cur.execute("SELECT tx, step FROM cp_spec")
rows = {}
for tx, step in cur.fetchall():
    rows.setdefault(int(tx), []).append(int(step))
print(json.dumps(rows))
"""


say = partial(output.say, "remusdb-drill-cp", err=True)


def guest_sh(name, script, timeout=120):
    qga = vm.vm_files("primary", name)["qga"]
    r = guest_agent.run(qga, ["/bin/sh", "-c", script], timeout=timeout)
    if r.get("exitcode") != 0:
        raise RuntimeError(f"in the guest: {script!r} failed: {r.get('err') or r.get('out')}")
    return r.get("out", "").strip()


def prepare_dbms(name, dbms, dbms_cp):
    """Starts the DBMS if it does not start at boot, and sets its switch."""
    value = "on" if dbms_cp else "off"
    if dbms == "postgres":
        guest_sh(name, "su postgres -c \"psql -qAt -c 'ALTER SYSTEM SET "
                       f"remusdb_commit_protection = {value}' -c 'SELECT pg_reload_conf()'\"")
        return guest_sh(name, "su postgres -c \"psql -qAt -c 'SHOW remusdb_commit_protection'\"")
    guest_sh(name, "systemctl start mariadb", timeout=300)
    guest_sh(name, f"mariadb -e 'SET GLOBAL remusdb_commit_protection = {value}'")
    shown = guest_sh(name, "mariadb -N -e 'SELECT @@GLOBAL.remusdb_commit_protection'")
    return {"1": "on", "0": "off"}.get(shown, shown)


def database_rows(dbms, ip):
    r = subprocess.run(["ip", "netns", "exec", workload.CLIENT_NS, "/usr/bin/python3", "-c",
                        ROWS, dbms, ip], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"reading the drill table failed: {r.stderr.strip()[-300:]}")
    return {int(k): set(v) for k, v in json.loads(r.stdout.strip().splitlines()[-1]).items()}


def wait_for_event(events_file, accept, timeout_s=5.0):
    """Returns once the client logged a new event that accept(event) takes
    (an acknowledgement, or a statement's result) with the ms since it
    was logged, when the cut follows; or after timeout_s, None.
    Why an acknowledgement: the power goes right after one, the moment at
    which one released too early (without the DBMS patch) is still in no
    checkpoint the backup has; at a random moment the drill often falls
    between TCG's bursts of commits, and the control then has nothing to
    lose (measured: 0 lost in 3 random-moment runs of ~4,800
    acknowledgements each)."""
    with open(events_file) as f:
        f.seek(0, 2)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            at = f.tell()
            line = f.readline()
            if not line.endswith("\n"):  # nothing new, or a line still being written
                f.seek(at)
                time.sleep(0.001)
                continue
            event = json.loads(line)
            if accept(event):
                return round((time.time() - event["t"]) * 1000, 1)
    return None


def is_ack(event):
    return event["ev"] == "ack"


def is_result_before_the_last_step(event):
    """A statement's result whose transaction's next statement is another
    INSERT, not its COMMIT: a break then finds it with results seen and
    its COMMIT unsent (after the last step's result, the COMMIT often
    leaves before the cut, and the transaction is merely in doubt)."""
    return event["ev"] == "step" and event["step"] < STEPS


def wait_for_a_new_epoch(name, timeout_s=10.0):
    """Returns the epoch number once the primary has cut and sent an epoch
    it had not when called: the guest runs the next one from then on."""
    first = protection.primary_protection("primary", name)["epoch"]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        epoch = protection.primary_protection("primary", name)["epoch"]
        if epoch != first:
            return epoch
        time.sleep(0.002)
    raise RuntimeError(f"the primary cut no epoch of {name} in {timeout_s:g} s (at {first})")


CUTS = ("after-result", "after-ack", "mid-epoch")
# A client still running this long after its planned end has a stalled
# connection (its statement in flight at the end has had ample time): it is
# killed and named in load_killed. It used to get 120 s from the takeover.
LOAD_END_GRACE_S = 20


def run(workdir, dbms="postgres", interval_ms=50, dbms_cp=True, failure_at_s=None,
        after_s=15, connections=8, ledger_connections=4, from_saved=False, cut="after-result"):
    """One drill; returns its result (a dict), with "wrong" listing every
    violation and "exercised" whether the load tested both lemmas.
    from_saved: the VM restored from its saved guest (vm.start), not booted.
    cut: where in the epoch the power goes (CUTS; the module's docstring)."""
    if cut not in CUTS:
        raise ValueError(f"cut must be one of {', '.join(CUTS)}, not {cut!r}")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    failure_at_s = failure_at_s if failure_at_s is not None else random.uniform(8, 14)
    result = {"dbms": dbms, "interval_ms": interval_ms, "dbms_commit_protection": dbms_cp,
              "failure_at_s": round(failure_at_s, 2), "cut": cut, "workdir": str(workdir)}
    injection = None
    stop_vm_everywhere(NAME)
    vm.ensure_daemon("backup")
    try:
        vm.start(NAME, "primary", fresh=True, wait_timeout=400, from_saved=from_saved)
        result["dbms_switch"] = prepare_dbms(NAME, dbms, dbms_cp)
        forget_ownership(NAME)
        protection.protect(NAME, BACKUP, interval_ms, options={"commit_protection": True})
        protection.wait_protected(NAME, timeout=900)
        seconds = failure_at_s + after_s
        events_file = workdir / "txclient.jsonl"
        ledger_file = workdir / "ledger.ids"
        tx = subprocess.Popen(
            ["ip", "netns", "exec", workload.CLIENT_NS, "/usr/bin/python3", str(TXCLIENT),
             "--dbms", dbms, "--host", vm.DEFAULT_IP, "--connections", str(connections),
             "--seconds", str(seconds), "--steps", str(STEPS),
             "--think-ms", str(interval_ms / 2),
             "--out", str(events_file)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        ledger = None
        if dbms == "postgres" and ledger_connections:
            # Commits spread over the epoch, and fast enough that the few
            # tens of ms between the last committed cut and the power cut
            # hold several: without the DBMS patch, those are the ones lost.
            ledger = workload.start_ledger(vm.DEFAULT_IP, ledger_file, seconds,
                                           connections=ledger_connections,
                                           think_ms=interval_ms / 4)
        started = time.time()
        time.sleep(max(0.0, started + failure_at_s - time.time()))
        before = protection.primary_protection("primary", NAME)
        if before.get("state") != "protected":
            raise RuntimeError(f"not protected at the failure time: {before.get('error')}")
        result["primary_commit_protection"] = before.get("commit_protection")
        injection = Injection("power", NAME)
        if cut == "mid-epoch":
            # The epoch the backup can at most have when the power goes.
            result["epoch_sent_before_cut"] = wait_for_a_new_epoch(NAME)
            time.sleep(interval_ms / 4000)
        result["cut_after_ack_ms"] = wait_for_event(events_file, is_ack)
        if cut == "after-result":
            result["cut_after_result_ms"] = wait_for_event(events_file,
                                                           is_result_before_the_last_step)
        failure_at = injection.inject()
        say(f"power cut at {failure_at - started:.1f} s into the load")
        replica = protection.wait_active(NAME, "backup", timeout=120)
        result["load_killed"] = []
        for proc in (tx, ledger):
            if proc is None:
                continue
            name = "txclient" if proc is tx else "ledger"
            try:
                out, _ = proc.communicate(
                    timeout=max(1.0, started + seconds + LOAD_END_GRACE_S - time.time()))
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
                result["load_killed"].append(name)
                say(f"{name} still ran {LOAD_END_GRACE_S} s after its planned end "
                    "(a connection of it stalled): killed")
            (workdir / f"{name}.out").write_text(out or "")
        replica = protection.replica("backup", NAME) or replica
        evidence = injection.evidence()
        rows = database_rows(dbms, vm.DEFAULT_IP)
        events = read_events(events_file)
        verdict, wrong = judge(events, rows, STEPS, failure_at)
        acked_before = sum(1 for e in events if e["ev"] == "ack" and e["t"] < failure_at)
        result.update(verdict)
        result["acknowledged_before_failure"] = acked_before
        if ledger is not None:
            acked_ids = workload.ledger_acked_ids(ledger_file)
            missing = workload.missing_acked(vm.DEFAULT_IP, acked_ids)
            result["ledger_acknowledged"] = len(acked_ids)
            result["ledger_lost"] = len(missing)
            wrong += [f"ledger id {i}: acknowledged, not in the database" for i in missing[:20]]
        result["committed_epoch"] = replica.get("committed_epoch")
        failover = replica.get("failover") or {}
        result["takeover_ms"] = failover.get("total_ms")
        result["resumed_after_failure_s"] = (round(failover["resumed_at_unix"] - failure_at, 3)
                                             if failover.get("resumed_at_unix") else None)
        result["backup_flows"] = replica.get("flows")
        result["frames_out_after_cut"] = (evidence or {}).get("lan_frames_from_primary_after_cut")
        result["wrong"] = wrong
        result["exercised"] = bool(acked_before and result["acknowledged_after_failure"]
                                   and result["broken_with_results_seen"]
                                   and (ledger is None or result["ledger_acknowledged"]))
        result["passed"] = result["exercised"] and not wrong
    finally:
        if injection is not None:
            injection.undo()
        stop_vm_everywhere(NAME)
    (workdir / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
