"""The failover drill: protect a database VM, run a client load against
it, fail the primary host in the middle, and measure what the clients saw.

The question a drill answers is the one RemusDB makes its promise about:
after the primary dies, is every commit that a client saw acknowledged
still in the database, and how long did the clients stall?  So the
evidence comes from the client side, never from the daemons' own view:

- the commit ledger (ledger.py) inserts numbered rows from rdb-client and
  writes an id only after PostgreSQL acknowledged its COMMIT; every such
  id must be in the table afterwards.  This module timestamps each id as
  it appears in the ledger's file (polled every few ms), which gives the
  client-visible downtime without changing the ledger;
- pgbench's per-second progress lines give the throughput over time, and
  its "client N aborted" lines tell which connections broke.

The daemons' status only adds the why: checkpoint pause times and epoch
sizes just before the failure, and the backup's own takeover timings.

Every call that touches the VM or a daemon has a timeout, because the
drill's whole point is that the primary vanishes in the middle of them:
pgbench and the ledger are stopped by signal rather than trusted to end,
and psql/pg_amcheck run under subprocess timeouts.
"""
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import netns, paths, protection, vm, workload
from .protection import ProtectionError

MODES = ("kill", "cut-link")
RANDOM_FAILURE_RANGE_S = (10, 30)
TAKEOVER_TIMEOUT_S = 60
PROTECT_TIMEOUT_S = 900          # initial disk + memory copy under TCG
BOOT_TIMEOUT_S = 400
WINDOW_S = 10                    # tps_before / tps_after average over this much
LEDGER_POLL_S = 0.005            # resolution of the ack timestamps
STOP_GRACE_S = 5
PSQL_TIMEOUT_S = 30
LOAD_CONNECT_TIMEOUT_S = 120
AMCHECK_TIMEOUT_S = 900
PRIMARY_PORT = "p-primary"       # the primary's veth port on the LAN bridge


class DrillError(Exception):
    """The drill could not be carried out (as opposed to a failed check)."""


@dataclass
class DrillOptions:
    mode: str = "kill"
    interval_ms: int = 100
    failure_at_s: float = 20.0
    after_s: float = 20.0
    clients: int = 4
    output_commit: bool = True
    protect: bool = True          # False: development dry run, load only
    keep: bool = False
    vm_name: str = "drill"
    ip: str = vm.DEFAULT_IP


def say(msg):
    print(f"[drill] {msg}", file=sys.stderr, flush=True)


def random_failure_time():
    return round(random.uniform(*RANDOM_FAILURE_RANGE_S), 1)


# ---------------------------------------------------------------- parsing
# Pure functions over what pgbench and the ledger printed; each takes
# (unix time seen, line) pairs so that they can be checked without a VM.

PROGRESS_RE = re.compile(r"progress: ([\d.]+) s, ([\d.]+) tps")
ABORT_RE = re.compile(r"client (\d+) aborted")
LEDGER_SUMMARY_RE = re.compile(r"ledger: acked=(\d+) errors=(\d+) reconnects=(\d+)")


def parse_progress(lines):
    """pgbench -P 1 --progress-timestamp lines -> [(unix time, tps)]: the
    TPS of the second that ended at that time."""
    out = []
    for _, line in lines:
        m = PROGRESS_RE.search(line)
        if m:
            out.append((float(m.group(1)), float(m.group(2))))
    return out


def aborted_clients(lines):
    """{client number: unix time its abort was printed}."""
    out = {}
    for seen, line in lines:
        m = ABORT_RE.search(line)
        if m:
            out.setdefault(int(m.group(1)), seen)
    return out


def ledger_error_times(lines):
    """When the ledger lost its connection: it prints one line per error
    and reconnects after each, so every error is a broken connection."""
    return [seen for seen, line in lines
            if line.startswith("ledger: ") and not LEDGER_SUMMARY_RE.search(line)]


def mean_tps(progress, t0, t1):
    """Mean of the per-second TPS reports that ended in (t0, t1]."""
    values = [tps for t, tps in progress if t0 < t <= t1]
    return sum(values) / len(values) if values else None


def per_second(times, t0, t1):
    """Counts of events in each whole second [t0 + i, t0 + i + 1) up to t1."""
    bins = [0] * max(0, int(t1 - t0))
    for t in times:
        i = int(t - t0)
        if 0 <= i < len(bins):
            bins[i] += 1
    return bins


def outage(ack_times, window_start, window_end):
    """The longest gap between consecutive acknowledgements that overlaps
    [window_start, window_end] (the failure until the takeover ended):
    the stall the clients saw.  Returns (gap start, gap end or None when
    nothing was acknowledged after it)."""
    times = sorted(ack_times)
    before = [t for t in times if t <= window_start]
    start = before[-1] if before else None
    best = None
    prev = start
    for t in times:
        if t <= window_start:
            continue
        if prev is not None and (best is None or t - prev > best[1] - best[0]):
            best = (prev, t)
        prev = t
        if t > window_end:
            break
    if best is None:
        return (start, None)
    return best


# ---------------------------------------------------------------- the load

class OutputWatcher(threading.Thread):
    """Collects a child's output lines with the time each was seen."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream = stream
        self.lines = []

    def run(self):
        for line in self.stream:
            self.lines.append((time.time(), line.rstrip("\n")))


class AckWatcher(threading.Thread):
    """Tails the ledger's file of acknowledged ids and timestamps each id
    when it appears (within LEDGER_POLL_S of the ledger writing it)."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.path = Path(path)
        self.acks = []  # (unix time, id)
        self.stopping = threading.Event()
        self._offset, self._partial = 0, b""

    def poll(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        if not data:
            return
        now = time.time()
        self._offset += len(data)
        data = self._partial + data
        *complete, self._partial = data.split(b"\n")
        self.acks += [(now, int(x)) for x in complete if x.strip()]

    def run(self):
        while not self.stopping.is_set():
            self.poll()
            time.sleep(LEDGER_POLL_S)
        self.poll()


class Load:
    """pgbench and the commit ledger from rdb-client, for at most
    `seconds`; stop() ends both (they cannot be trusted to end by
    themselves when the server vanished under them)."""

    def __init__(self, ip, clients, seconds, workdir):
        self.clients = clients
        self.ledger_file = Path(workdir) / "ledger.ids"
        self.started = time.time()
        cmd = ["ip", "netns", "exec", workload.CLIENT_NS, "pgbench", "-h", ip,
               "-U", workload.DB_USER, "-c", str(clients), "-j", "1", "-T", str(int(seconds)),
               "-P", "1", "--progress-timestamp", "-n", workload.DB_NAME]
        # A guest checkpointed every 25 ms under TCG runs slowly enough that
        # four connections take longer than libpq's usual 10 s: the load must
        # wait for them rather than end the drill before it starts.
        env = dict(workload.PG_ENV, PGCONNECT_TIMEOUT=str(LOAD_CONNECT_TIMEOUT_S))
        self.pgbench = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True)
        try:
            self.ledger = workload.start_ledger(ip, self.ledger_file, seconds)
        except OSError:
            self.pgbench.kill()
            self.pgbench.wait()
            raise
        self.pgbench_out = OutputWatcher(self.pgbench.stdout)
        self.ledger_out = OutputWatcher(self.ledger.stdout)
        self.acks = AckWatcher(self.ledger_file)
        for t in (self.pgbench_out, self.ledger_out, self.acks):
            t.start()

    def check_running(self):
        for name, proc, out in (("pgbench", self.pgbench, self.pgbench_out),
                                ("the ledger", self.ledger, self.ledger_out)):
            if proc.poll() is not None:
                tail = "\n".join(line for _, line in out.lines[-15:])
                raise DrillError(f"{name} ended early (exit {proc.returncode}):\n{tail}")

    def stop(self):
        for proc in (self.pgbench, self.ledger):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (self.pgbench, self.ledger):
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.stopped = time.time()
        self.acks.stopping.set()
        for t in (self.pgbench_out, self.ledger_out, self.acks):
            t.join(timeout=STOP_GRACE_S)


# ---------------------------------------------------------------- database checks

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


# ---------------------------------------------------------------- the lab

def ensure_witness():
    """Protection arbitrates through the lab's etcd witness; its module is
    written alongside this one, so tolerate its absence with a clear word."""
    try:
        from remusdb import witness
    except ImportError:
        raise DrillError("tools/lib/remusdb/witness.py (the lab's etcd witness) is missing: "
                         "protection cannot arbitrate without it. (--no-protect runs the "
                         "load alone.)")
    start, endpoints = getattr(witness, "start", None), getattr(witness, "endpoints", None)
    if start is None or endpoints is None:
        raise DrillError("tools/lib/remusdb/witness.py has no start()/endpoints(): "
                         "cannot bring up the etcd witness")
    if not endpoints():
        say("starting the etcd witness")
        start()
    say(f"witness: {endpoints()}")


def ownership_key(name):
    """The witness key remusdbd arbitrates a VM's ownership with
    (WITNESS_KEY_PREFIX/SUFFIX in dom0-daemon/src/witness_proto.h)."""
    return f"/remusdb/vms/{name}/owner"


def forget_ownership(name):
    """A drill boots a brand-new VM under a reused name; the witness still
    says which host owned the previous one (the backup, after the last
    drill), and remusdbd rightly refuses to protect a VM another host owns.
    So the record goes, as it would for a VM that was deleted."""
    cmd = ["ip", "netns", "exec", netns.namespace_of("primary"), "etcdctl",
           "--endpoints", vm.etcd_endpoints(), "--dial-timeout", "3s",
           "--command-timeout", "5s", "del", ownership_key(name)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        raise DrillError("etcdctl timed out clearing the VM's ownership in the witness")
    if r.returncode != 0:
        raise DrillError(f"cannot clear {ownership_key(name)} in the witness: "
                         f"{(r.stdout + r.stderr).strip()}")


def lab_up(need_witness):
    netns.up()
    if need_witness:
        ensure_witness()


def vm_present(host, name):
    """Runs there, or that host's remusdbd still knows it."""
    if protection.qemu_running(host, name):
        return True
    try:
        return any(v.get("name") == name for v in protection.status(host).get("vms", []))
    except ProtectionError:
        return False


def stop_vm_everywhere(name):
    """Stops the VM on both hosts. A primary whose remusdbd was killed gets
    it back first, as the rebooted host would, so that it forgets the VM
    (its definition is persisted and would block the next start)."""
    for host in ("backup", "primary"):
        try:
            if host == "primary":
                vm.ensure_daemon(host)
            if not vm_present(host, name):
                continue
            try:
                protection.unprotect(name, host)
            except ProtectionError:
                pass  # not protected there: the usual case
            vm.stop(name, host)
        except (Exception, SystemExit) as e:  # cleanup goes on with the other host
            say(f"stopping {name} on {host}: {e}")


def check_backup_free(name):
    """remusdbd on the backup refuses a new protection of a VM it is taking
    over, or one that runs there; say so before booting anything. (A
    replica it took over earlier stays listed as "active" after the VM was
    stopped there; the daemon replaces that one, so it is no obstacle.)"""
    try:
        r = protection.replica("backup", name)
    except ProtectionError as e:
        raise DrillError(str(e))
    state = (r or {}).get("state")
    if state in ("failing-over", "arbitrating") or (state == "active"
                                                    and vm_present("backup", name)):
        raise DrillError(f"the backup's remusdbd holds a replica of {name} in state {state} "
                         f"and refuses to protect that name again: use another --vm, or stop "
                         f"{name} on the backup host (tools/remusdb-vm stop {name} --host "
                         f"backup)")


def forget_backup_console(name):
    """The backup's console log of an earlier takeover must not be read as
    this run's (a takeover that never starts QEMU leaves it in place)."""
    try:
        (paths.vm_run_dir("backup", name) / "console.log").unlink()
    except FileNotFoundError:
        pass


def set_primary_link(up):
    netns.sh("ip", "-n", netns.LAN_NS, "link", "set", PRIMARY_PORT, "up" if up else "down")


# ---------------------------------------------------------------- failure injection

def live_pid(pid_file, must_contain):
    """The pid in pid_file if it runs a command containing must_contain
    (a reused pid must never be killed)."""
    try:
        pid = int(Path(pid_file).read_text())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if must_contain in f.read():
                return pid
    except (OSError, ValueError):
        pass
    return None


def kill_primary(name):
    """SIGKILLs the primary's QEMU and its remusdbd in the same instant:
    the host lost power, nothing gets to say goodbye."""
    qemu = live_pid(paths.vm_run_dir("primary", name) / "qemu.pid", b"qemu")
    daemon_pid_file = paths.host_run_dir("primary") / "remusdbd.pid"
    daemon = live_pid(daemon_pid_file, b"remusdbd")
    if qemu is None:
        raise DrillError(f"the primary's QEMU for {name} is not running: nothing to kill")
    if daemon is None:
        raise DrillError(f"no running remusdbd pid in {daemon_pid_file}")
    at = time.time()
    os.kill(qemu, signal.SIGKILL)
    os.kill(daemon, signal.SIGKILL)
    return at


def inject(mode, name):
    if mode == "kill":
        return kill_primary(name)
    at = time.time()
    set_primary_link(False)
    return at


# ---------------------------------------------------------------- the drill

def boot_and_protect(opts):
    say(f"booting {opts.vm_name} on primary ({opts.ip}), fresh disk")
    files = vm.start(opts.vm_name, "primary", ip=opts.ip, fresh=True, wait_timeout=BOOT_TIMEOUT_S)
    meta = json.loads(files["meta"].read_text())
    protect_s = None
    if opts.protect:
        backup = protection.parse_backup("backup")
        say(f"protecting {opts.vm_name} to {backup} every {opts.interval_ms} ms"
            + ("" if opts.output_commit else " WITHOUT OUTPUT COMMIT (negative control)"))
        started = time.monotonic()
        protection.protect(opts.vm_name, backup, opts.interval_ms, output_commit=opts.output_commit)
        protection.wait_protected(opts.vm_name, "primary", PROTECT_TIMEOUT_S,
                                  progress=lambda p: say(protection.describe_progress(p)))
        protect_s = round(time.monotonic() - started, 1)
        say(f"{opts.vm_name} protected in {protect_s} s")
    return meta, protect_s


def sample_primary(name):
    try:
        return protection.primary_protection("primary", name)
    except ProtectionError as e:
        say(f"primary status: {e}")
        return None


def run_until(load, deadline, every=None):
    """Keeps the load running until `deadline` (unix time), calling
    every() about once a second; raises if the load died."""
    while time.time() < deadline:
        load.check_running()
        if every:
            every()
        time.sleep(max(0.0, min(1.0, deadline - time.time())))


def exercise(opts):
    """Load, failure, takeover, more load. Returns the raw observations."""
    obs = {"primary_before": None, "replica": None, "takeover_error": None,
           "failure_at": None, "link_cut": False}
    total = opts.failure_at_s + TAKEOVER_TIMEOUT_S + opts.after_s + 60
    with tempfile.TemporaryDirectory(prefix="remusdb-drill-") as tmp:
        load = Load(opts.ip, opts.clients, total, tmp)
        say(f"load: pgbench ({opts.clients} clients) + commit ledger; failure at "
            f"{opts.failure_at_s:g} s" + ("" if opts.protect else " (not injected: --no-protect)"))
        try:
            def sample():
                if opts.protect:
                    obs["primary_before"] = sample_primary(opts.vm_name) or obs["primary_before"]
            run_until(load, load.started + opts.failure_at_s, every=sample)
            sample()
            p = obs["primary_before"]
            if opts.protect and (p or {}).get("state") != "protected":
                raise DrillError(f"{opts.vm_name} is not protected at the failure time "
                                 f"(state {(p or {}).get('state')}: {(p or {}).get('error')})")
            if opts.protect:
                obs["link_cut"] = opts.mode == "cut-link"
                obs["failure_at"] = inject(opts.mode, opts.vm_name)
                say(f"FAILURE injected: {opts.mode}")
                try:
                    obs["replica"] = protection.wait_active(
                        opts.vm_name, "backup", TAKEOVER_TIMEOUT_S,
                        progress=lambda r: say(f"backup replica: {r.get('state')}"))
                    say("the backup runs the VM")
                except ProtectionError as e:
                    obs["takeover_error"] = str(e)
                    say(f"no takeover: {e}")
            else:
                obs["failure_at"] = time.time()
            if obs["takeover_error"] is None:
                run_until(load, time.time() + opts.after_s)
        finally:
            load.stop()
        obs["load"] = load
        obs["acked_ids"] = workload.ledger_acked_ids(load.ledger_file)
    if opts.protect and obs["replica"] is not None:
        try:  # the final picture, with every failover timing filled in
            obs["replica"] = protection.replica("backup", opts.vm_name) or obs["replica"]
        except ProtectionError:
            pass
    return obs


def measure(opts, meta, protect_s, obs):
    """Turns the observations into the drill's result: a flat dict (the
    JSON), times in seconds since the load started unless named *_unix.
    lost_acked_commits and amcheck_clean are None when the database did
    not answer afterwards (unknown, never "fine")."""
    load = obs["load"]
    t0, fail_at, stop_at = load.started, obs["failure_at"], load.stopped
    progress = parse_progress(load.pgbench_out.lines)
    aborted = aborted_clients(load.pgbench_out.lines)
    ledger_errors = ledger_error_times(load.ledger_out.lines)
    ack_times = [t for t, _ in load.acks.acks]

    replica = obs["replica"] or {}
    fo = replica.get("failover") or {}
    takeover_ms = fo.get("total_ms")
    resumed = fo.get("resumed_at_unix")
    if resumed is None and takeover_ms is not None:
        resumed = fail_at + takeover_ms / 1000
    gap = outage(ack_times, fail_at, resumed or fail_at)
    downtime_ms = None if gap[0] is None or gap[1] is None else round((gap[1] - gap[0]) * 1000, 1)

    # A connection survived when it never failed and still worked at the
    # end: a client stuck for good on a dead or crashed server has not
    # survived, though it never saw an error. pgbench reports progress per
    # run, not per client, so its clients count when they did not abort
    # and pgbench committed in the final window; the ledger's one
    # connection is judged exactly.
    settled = resumed or fail_at
    final_from = stop_at - min(WINDOW_S, max(0.0, stop_at - settled))
    pgbench_before = [c for c in range(opts.clients) if aborted.get(c, stop_at) > fail_at]
    pgbench_at_end = any(tps > 0 for t, tps in progress if t > final_from)
    ledger_before = (any(t <= fail_at for t in ack_times)
                     and not any(t <= fail_at for t in ledger_errors))
    ledger_at_end = any(t > final_from for t in ack_times)
    survived = (len([c for c in pgbench_before if c not in aborted]) if pgbench_at_end else 0) \
        + (1 if ledger_before and ledger_at_end and not ledger_errors else 0)

    acked = obs["acked_ids"]
    # without a takeover the database is most likely gone: one try only
    present = ledger_ids_in_db(opts.ip, tries=5 if obs["takeover_error"] is None else 1)
    lost = None if present is None else sorted(set(acked) - present)
    # None: not run, because the database does not answer
    clean, amcheck_text = amcheck(opts.ip) if present is not None else (None, None)

    console_errors = guest_kernel_errors("backup" if replica else "primary", opts.vm_name)
    p = obs["primary_before"] or {}
    rel = lambda t: None if t is None else round(t - t0, 3)  # noqa: E731
    result = {
        "drill": "failover",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "mode": opts.mode if opts.protect else "none (--no-protect dry run)",
        "vm": opts.vm_name, "ip": opts.ip, "accel": meta.get("accel"),
        "interval_ms": opts.interval_ms if opts.protect else None,
        "output_commit": opts.output_commit if opts.protect else None,
        "protected": opts.protect, "protect_s": protect_s,
        "clients": opts.clients,
        "failure_at_s": rel(fail_at),
        "failure_at_unix": fail_at,
        "takeover": bool(replica) and replica.get("state") == "active",
        "takeover_ms": takeover_ms,
        "takeover_error": obs["takeover_error"],
        "failover": fo or None,
        "replica_committed_epoch": replica.get("committed_epoch"),
        "acked_commits": len(acked),
        "lost_acked_commits": None if lost is None else len(lost),
        "lost_acked_ids": None if lost is None else lost[:50],
        "downtime_ms": downtime_ms,
        "connections_before": len(pgbench_before) + (1 if ledger_before else 0),
        "connections_survived": survived,
        "pgbench_aborted_clients": sorted(aborted),
        "ledger_reconnects": len(ledger_errors),
        "tps_before": mean_tps(progress, fail_at - WINDOW_S, fail_at),
        "tps_after": mean_tps(progress, final_from, stop_at) or 0.0,
        "epochs": p.get("epochs"),
        "pause_ms_p50": p.get("pause_ms_p50"),
        "pause_ms_p99": p.get("pause_ms_p99"),
        "bytes_per_epoch_mean": p.get("bytes_per_epoch_mean"),
        "primary_status_before_failure": p or None,
        "guest_kernel_errors": console_errors,
        "amcheck_clean": clean,
        "amcheck_output": None if clean or amcheck_text is None else amcheck_text[-2000:],
        "load_seconds": round(stop_at - t0, 1),
        "timeline": {
            "pgbench_tps": [[rel(t), tps] for t, tps in progress],
            "ledger_commits_per_s": per_second(ack_times, t0, stop_at),
            "ledger_ack_s": [rel(t) for t in ack_times],
            "takeover_window_s": ([rel(fail_at), rel(resumed)] if resumed else None),
            "outage_s": [rel(gap[0]), rel(gap[1])],
        },
    }
    result["passed"], result["verdict"] = verdict(opts, result)
    return result


def verdict(opts, r):
    problems = []
    if r["lost_acked_commits"] is None:
        problems.append("could not check the acknowledged commits (database unreachable)")
    elif r["lost_acked_commits"]:
        problems.append(f"{r['lost_acked_commits']} acknowledged commits LOST")
    if r["amcheck_clean"] is None:
        problems.append("pg_amcheck not run")
    elif not r["amcheck_clean"]:
        problems.append("pg_amcheck found problems")
    if r["guest_kernel_errors"]:
        problems.append(f"the guest kernel logged {len(r['guest_kernel_errors'])} errors")
    if opts.protect and opts.output_commit and not r["takeover"]:
        problems.append("no takeover")
    return (not problems, "PASS" if not problems else "FAIL: " + "; ".join(problems))


def run(opts):
    """The whole drill; returns its result (see measure()). Leaves the lab
    up; stops the VM on both hosts unless opts.keep."""
    if opts.mode not in MODES:
        raise DrillError(f"unknown mode {opts.mode!r}: use one of {', '.join(MODES)}")
    vm.check_name(opts.vm_name)
    lab_up(opts.protect)
    vm.ensure_daemon("primary")
    if opts.protect:
        vm.ensure_daemon("backup")
    stop_vm_everywhere(opts.vm_name)
    forget_backup_console(opts.vm_name)
    if opts.protect:
        check_backup_free(opts.vm_name)
        forget_ownership(opts.vm_name)
    try:
        meta, protect_s = boot_and_protect(opts)
        obs = exercise(opts)
        return measure(opts, meta, protect_s, obs)
    finally:
        # the old primary's VM goes before its link comes back, so that it
        # never meets the new one on the LAN
        if opts.keep:
            say(f"--keep: {opts.vm_name} left running (tools/remusdb status shows where)")
        else:
            stop_vm_everywhere(opts.vm_name)
        if opts.protect and opts.mode == "cut-link":
            try:
                set_primary_link(True)  # never leave the shared lab cut, even with --keep
            except subprocess.CalledProcessError as e:
                say(f"could not bring {PRIMARY_PORT} back up: {e}")


# ---------------------------------------------------------------- report

def fmt(value, spec=".1f", unit=""):
    return "n/a" if value is None else f"{value:{spec}}{unit}"


def amcheck_words(r):
    if r["amcheck_clean"] is None:
        return "not run (the database does not answer)"
    return "clean" if r["amcheck_clean"] else f"NOT clean: {r['amcheck_output']}"


def summary(r):
    lines = [f"== failover drill: {r['mode']}"
             + (f", interval {r['interval_ms']} ms, output commit "
                f"{'on' if r['output_commit'] else 'OFF (negative control)'}"
                if r["protected"] else "") + f", {r['accel']} =="]
    if r["protected"]:
        lines.append(f"protected in {fmt(r['protect_s'], '.1f', ' s')}; failure at "
                     f"{fmt(r['failure_at_s'], '.1f', ' s')} into the load")
        lines.append(f"takeover: {'yes' if r['takeover'] else 'NO'}"
                     + (f", {fmt(r['takeover_ms'], '.0f', ' ms')} from epoch "
                        f"{r['replica_committed_epoch']}" if r["takeover"] else
                        f" ({r['takeover_error']})"))
    downtime = (fmt(r["downtime_ms"], ".0f", " ms") if r["downtime_ms"] is not None
                else "endless (no commit acknowledged after the failure)")
    lines.append(f"acknowledged commits {r['acked_commits']}, lost "
                 f"{fmt(r['lost_acked_commits'], 'd')}; client-visible downtime {downtime}")
    lines.append(f"connections survived {r['connections_survived']} of "
                 f"{r['connections_before']} (pgbench clients aborted: "
                 f"{r['pgbench_aborted_clients'] or 'none'}, ledger reconnects: "
                 f"{r['ledger_reconnects']})")
    lines.append(f"TPS before {fmt(r['tps_before'])}, after {fmt(r['tps_after'])}")
    if r["protected"]:
        lines.append(f"before the failure: {fmt(r['epochs'], 'd')} epochs, pause p50/p99 "
                     f"{fmt(r['pause_ms_p50'])}/{fmt(r['pause_ms_p99'], '.1f', ' ms')}, "
                     f"{fmt((r['bytes_per_epoch_mean'] or 0) / 1024, '.1f', ' KiB')}/epoch")
    if r["guest_kernel_errors"]:
        lines.append(f"guest kernel errors on the console: {len(r['guest_kernel_errors'])}, "
                     f"first: {r['guest_kernel_errors'][0]}")
    lines.append(f"pg_amcheck: {amcheck_words(r)}")
    lines.append(r["verdict"])
    return "\n".join(lines)
