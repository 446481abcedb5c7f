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
- pgbench's per-second progress lines give the throughput over time, its
  per-transaction log (-l) which client committed when;
- which connections survived is judged from the server's side
  (drill/survival.py).

The daemons' status only adds the why: checkpoint pause times and epoch
sizes just before the failure, and the backup's own takeover timings.

Every call that touches the VM or a daemon has a timeout, because the
drill's whole point is that the primary vanishes in the middle of them.
The load is sized to end by itself (so that pgbench flushes its logs) and
is stopped by signal only when it does not.  A drill that cannot be
carried out is still a result: a failed drill with its reason.

Everything a drill saw stays in its work directory (named in the JSON):
pgbench's raw output and per-transaction logs, the ledger's output and
ids, the pg_stat_activity snapshots and the result itself.
"""
import glob
import json
import os
import random
import re
import signal
import subprocess
import threading
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from .. import guest_agent, protection, switchover
from ..lab import vm, workload
from .database import (activity_snapshot, amcheck, guest_kernel_errors,  # noqa: F401
                       ledger_ids_in_db)
from .inject import InjectError, Injection, remove_leftover_cut
from .lab import (DrillError, check_backup_free, forget_backup_console,  # noqa: F401
                        forget_ownership, lab_up, say, stop_vm_everywhere)
from .survival import (PGBENCH_APP, ledger_workers_with_errors, parse_pgbench_log,
                             survival)
from ..protection import ProtectionError

# switchover: no failure, the planned role swap (remusdb/switchover.py) in its place
MODES = ("power", "kill", "cut-link", "switchover")
RANDOM_FAILURE_RANGE_S = (10, 30)
TAKEOVER_TIMEOUT_S = 60
SWITCHOVER_STEP_TIMEOUT_S = 30
# The load is planned to last failure + this + --after: room for the
# takeover, so that --after seconds of load normally follow it.
TAKEOVER_BUDGET_S = 10
AFTER_SNAPSHOT_DELAY_S = 5       # after the takeover: clients had time to go on
LOAD_END_GRACE_S = 15            # for the load to end by itself at its planned end
# A negative control's clients can wait for ever on replies the resumed VM
# never sent (pgbench did, after --unsafe-release-early): its verdict is in
# the ledger, so they are stopped sooner.
CONTROL_END_GRACE_S = 3
EARLY_SLACK_S = 2                # a process that ends sooner than this before plan ended early
PROTECT_TIMEOUT_S = 900          # initial disk + memory copy under TCG
BOOT_TIMEOUT_S = 400
WINDOW_S = 10                    # tps_before / tps_after average over this much
LEDGER_POLL_S = 0.005            # resolution of the ack timestamps
STOP_GRACE_S = 5
# The ledger's own clock runs this much past the plan: end() ends it at the
# plan (SIGUSR1, ledger.py), after the after-snapshot. On its own clock it
# ended up to a second before pgbench (whose -T starts once its clients
# are connected), and a late snapshot then found only pgbench's backends.
LEDGER_CLOCK_SLACK_S = 60
LOAD_CONNECT_TIMEOUT_S = 120
# Outside paths.STATE: `remusdb-lab down` wipes that, and a drill's
# evidence must outlive the lab.
DRILLS_DIR = Path(os.environ.get("REMUSDB_DRILLS", "/var/lib/remusdb-drills"))


@dataclass
class DrillOptions:
    mode: str = "power"
    interval_ms: int = 100
    failure_at_s: float = 20.0
    after_s: float = 20.0
    clients: int = 4
    # ledger.py says why several connections with think time over one epoch
    ledger_connections: int = 4
    output_commit: bool = True
    release_early: bool = False   # negative control: output one epoch early
    protect: bool = True          # False: development dry run, load only
    keep: bool = False
    vm_name: str = "drill"
    ip: str = vm.DEFAULT_IP
    workdir_base: str = str(DRILLS_DIR)
    index: int = 1                # the drill's number in a series
    restore: str = ""             # the backup daemon's --restore (shared/eager/lazy); "" = as it runs
    from_saved: bool = False      # the VM restored from its saved guest, not booted
    mem_mb: int = 1024            # the guest's RAM
    cpus: int = 1                 # the guest's vCPUs
    fill_mb: int = 0              # MiB of non-zero data the guest writes to its tmpfs first
    # A program the guest runs through its agent from protection on (argv), beside
    # the clients' load, e.g. rdb-dirty at a fixed rate (remusdb-bench scale).
    guest_load: tuple = ()

    @property
    def negative_control(self):
        return not self.output_commit or self.release_early


def random_failure_time():
    return round(random.uniform(*RANDOM_FAILURE_RANGE_S), 1)


def make_workdir(opts):
    """<base>/<date>-<vm>-<n>, never reused."""
    base = Path(opts.workdir_base)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for extra in range(100):
        d = base / (f"{stamp}-{opts.vm_name}-{opts.index}" + (f".{extra}" if extra else ""))
        try:
            d.mkdir(parents=True)
            return d
        except FileExistsError:
            continue
        except OSError as e:
            raise DrillError(f"cannot make the work directory {d}: {e}")
    raise DrillError(f"cannot make a fresh work directory under {base}")


# ---------------------------------------------------------------- parsing
# Pure functions over what pgbench and the ledger printed; each takes
# (unix time seen, line) pairs so that they can be checked without a VM.

PROGRESS_RE = re.compile(r"progress: ([\d.]+) s, ([\d.]+) tps")
# "client 3 aborted in command 4 (SQL) of script 0" (PostgreSQL 14 and
# older) and "client 3 script 0 aborted in command 4 query 0" (15).
ABORT_RE = re.compile(r"\bclient (\d+) (?:script \d+ )?aborted\b")
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


def outage(ack_times, failure_at, load_end, resumed_at=None):
    """The stall the clients saw: (start, end, recovered).

    The clients recovered only if something was acknowledged after the
    backup resumed the VM (after the failure when there was no takeover
    time).  Then the outage is the longest gap between consecutive
    acknowledgements that overlaps [failure_at, resumed_at].  Otherwise
    it began at the last acknowledgement (or at the failure, when there
    was none before it) and lasted until the load ended: a few replies
    released just after the failure are not a recovery."""
    times = sorted(ack_times)
    settled = max(failure_at, resumed_at) if resumed_at is not None else failure_at
    if not any(t > settled for t in times):
        last = times[-1] if times else failure_at
        return (last, max(load_end, last), False)
    before = [t for t in times if t <= failure_at]
    prev = before[-1] if before else failure_at
    best = None
    for t in times:
        if t <= failure_at:
            continue
        if best is None or t - prev > best[1] - best[0]:
            best = (prev, t)
        prev = t
        if t > settled:
            break
    return (best[0], best[1], True)


def ended_early(exit_times, planned_end):
    """{name: seconds before the planned end} of processes that ended
    sooner than EARLY_SLACK_S before it."""
    return {name: round(planned_end - t, 1) for name, t in exit_times.items()
            if t is not None and t < planned_end - EARLY_SLACK_S}


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
    """pgbench and the commit ledger from rdb-client, planned to last
    `seconds`; end() waits for them to finish by themselves and stops
    whichever does not (a client stuck on a vanished server never ends)."""

    def __init__(self, ip, clients, seconds, workdir, ledger_connections=1, think_ms=0):
        self.clients = clients
        self.ledger_connections = ledger_connections
        self.workdir = Path(workdir)
        self.ledger_file = self.workdir / "ledger.ids"
        self.log_prefix = self.workdir / "pgbench_log"
        self.started = time.time()
        self.planned_end = self.started + int(seconds)
        self.stopped = None
        self.exit_times = {"pgbench": None, "ledger": None}
        self.signalled = set()
        self.ledger_told_to_end = False
        cmd = ["ip", "netns", "exec", workload.CLIENT_NS, "pgbench", "-h", ip,
               "-U", workload.DB_USER, "-c", str(clients), "-j", "1", "-T", str(int(seconds)),
               "-P", "1", "--progress-timestamp", "-n",
               "-l", "--log-prefix", str(self.log_prefix), workload.DB_NAME]
        # A guest checkpointed every 25 ms under TCG runs slowly enough that
        # four connections take longer than libpq's usual 10 s: the load must
        # wait for them rather than end the drill before it starts.
        env = dict(workload.PG_ENV, PGCONNECT_TIMEOUT=str(LOAD_CONNECT_TIMEOUT_S),
                   PGAPPNAME=PGBENCH_APP)
        self.pgbench = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True)
        try:
            self.ledger = workload.start_ledger(ip, self.ledger_file,
                                                int(seconds) + LEDGER_CLOCK_SLACK_S,
                                                connections=ledger_connections,
                                                think_ms=think_ms)
        except OSError:
            self.pgbench.kill()
            self.pgbench.wait()
            raise
        self.pgbench_out = OutputWatcher(self.pgbench.stdout)
        self.ledger_out = OutputWatcher(self.ledger.stdout)
        self.acks = AckWatcher(self.ledger_file)
        for t in (self.pgbench_out, self.ledger_out, self.acks):
            t.start()

    def procs(self):
        return (("pgbench", self.pgbench, self.pgbench_out),
                ("ledger", self.ledger, self.ledger_out))

    def note_exits(self):
        """Records when each process was first seen gone; True if any is."""
        for name, proc, _ in self.procs():
            if self.exit_times[name] is None and proc.poll() is not None:
                self.exit_times[name] = time.time()
        return any(t is not None for t in self.exit_times.values())

    def check_running(self):
        """Before the failure the load must run: a load that collapsed
        makes the drill meaningless."""
        if not self.note_exits():
            return
        for name, proc, out in self.procs():
            if proc.poll() is not None:
                tail = "\n".join(line for _, line in out.lines[-15:])
                raise DrillError(f"the load collapsed before the failure: {name} ended early "
                                 f"(exit {proc.returncode}):\n{tail}")

    def end(self, grace=LOAD_END_GRACE_S):
        """Waits up to `grace` past the planned end for both to finish."""
        deadline = max(time.time(), self.planned_end) + grace
        while time.time() < deadline and not all(p.poll() is not None
                                                  for _, p, _ in self.procs()):
            if time.time() >= self.planned_end and not self.ledger_told_to_end:
                self.end_ledger()
            self.note_exits()
            time.sleep(0.1)
        self.stop()

    def end_ledger(self):
        """The ledger's planned end: its workers finish their commit, it
        prints its summary and exits 0 (SIGUSR1, ledger.py). Not a stop:
        it ends at its plan, and an earlier exit still counts as early."""
        self.ledger_told_to_end = True
        if self.ledger.poll() is None:
            self.ledger.send_signal(signal.SIGUSR1)

    def stop(self):
        if self.stopped is not None:
            return  # end() stopped it already
        self.note_exits()
        for name, proc, _ in self.procs():
            if proc.poll() is None:
                self.signalled.add(name)
                proc.send_signal(signal.SIGTERM)
        for _, proc, _ in self.procs():
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.note_exits()
        self.stopped = time.time()
        self.acks.stopping.set()
        for t in (self.pgbench_out, self.ledger_out, self.acks):
            t.join(timeout=STOP_GRACE_S)
        self.keep_output()

    def keep_output(self):
        """The raw output, and the same with the time each line was seen."""
        for name, _, out in self.procs():
            lines = list(out.lines)
            (self.workdir / f"{name}.out").write_text("".join(f"{line}\n" for _, line in lines))
            (self.workdir / f"{name}.out.timed").write_text(
                "".join(f"{t:.3f} {line}\n" for t, line in lines))

    def pgbench_log_files(self):
        return sorted(glob.glob(f"{self.log_prefix}.*"))

    def pgbench_commits(self):
        lines = []
        for f in self.pgbench_log_files():
            lines += Path(f).read_text(errors="replace").splitlines()
        return parse_pgbench_log(lines)


# ---------------------------------------------------------------- the drill

def fill_guest_memory(qga, mib):
    """The guest writes mib MiB of non-zero bytes to a tmpfs file: RAM that
    a takeover must restore, as a database's buffers would be, so that a
    bench can compare takeovers by how much of the guest's RAM is in use."""
    say(f"the guest fills {mib} MiB of its RAM (tmpfs)")
    script = (f"mount -t tmpfs -o size={mib + 16}m rdbfill /mnt && "
              f"yes remusdb-fill | head -c {mib}M > /mnt/fill")
    r = guest_agent.run(qga, ["/bin/sh", "-c", script], timeout=600)
    if r.get("exitcode") != 0:
        raise DrillError(f"filling {mib} MiB of the guest's RAM failed: "
                         f"{r.get('err') or r.get('out')}")


def guest_vcpus_online(qga):
    """The vCPUs the guest's kernel has online (qemu-guest-agent's guest-get-vcpus)."""
    with closing(guest_agent.GuestAgent(qga, 10.0)) as ga:
        return sum(1 for c in ga.command("guest-get-vcpus") if c.get("online"))


def boot_and_protect(opts):
    say(f"{'restoring' if opts.from_saved else 'booting'} {opts.vm_name} on primary "
        f"({opts.ip}), fresh disk")
    files = vm.start(opts.vm_name, "primary", ip=opts.ip, fresh=True, wait_timeout=BOOT_TIMEOUT_S,
                     from_saved=opts.from_saved, mem_mb=opts.mem_mb, cpus=opts.cpus)
    meta = json.loads(files["meta"].read_text())
    # What the guest itself counts, not what -smp asked for.
    meta["guest_vcpus_online"] = guest_vcpus_online(files["qga"])
    if opts.cpus != meta["guest_vcpus_online"]:
        raise DrillError(f"the guest runs {meta['guest_vcpus_online']} vCPUs online, "
                         f"not the {opts.cpus} asked for")
    if opts.fill_mb:
        fill_guest_memory(files["qga"], opts.fill_mb)
    protect_s = None
    if opts.protect:
        backup = protection.parse_backup("backup")
        # In a switchover drill the switchover itself releases early (cli/drill.py).
        release_early = opts.release_early and opts.mode != "switchover"
        say(f"protecting {opts.vm_name} to {backup} every {opts.interval_ms} ms"
            + ("" if opts.output_commit else " WITHOUT OUTPUT COMMIT (negative control)")
            + (" RELEASING OUTPUT ONE EPOCH EARLY (negative control)"
               if release_early else ""))
        started = time.monotonic()
        protection.protect(opts.vm_name, backup, opts.interval_ms,
                           output_commit=opts.output_commit,
                           unsafe_release_early=release_early)
        protection.wait_protected(opts.vm_name, "primary", PROTECT_TIMEOUT_S,
                                  progress=lambda p: say(protection.describe_progress(p)))
        protect_s = round(time.monotonic() - started, 1)
        say(f"{opts.vm_name} protected in {protect_s} s")
    if opts.guest_load:
        say(f"in the guest: {' '.join(opts.guest_load)}")
        meta["guest_load_pid"] = guest_agent.start(files["qga"], list(opts.guest_load))
    return meta, protect_s


def sample_primary(name):
    try:
        return protection.primary_protection("primary", name)
    except ProtectionError as e:
        say(f"primary status: {e}")
        return None


def run_until(load, deadline, every=None, strict=True):
    """Keeps the load running until `deadline` (unix time), calling
    every() about once a second. strict: the load must not end (raises);
    otherwise returns early once both load processes ended."""
    while time.time() < deadline:
        if strict:
            load.check_running()
        elif load.note_exits() and all(t is not None for t in load.exit_times.values()):
            return
        if every:
            every()
        time.sleep(max(0.0, min(1.0, deadline - time.time())))


def exercise(opts, workdir, injection):
    """Load, failure, takeover, more load. Returns the raw observations;
    obs["load"] is set as soon as the load started, so that a drill that
    breaks off still has what it saw."""
    obs = {"primary_before": None, "replica": None, "takeover_error": None,
           "failure_at": None, "activity_before": None, "activity_after": None,
           "load": None, "switchover": None, "protect_back": None}
    seconds = opts.failure_at_s + TAKEOVER_BUDGET_S + opts.after_s
    # ledger commits spread over a checkpoint interval (ledger.py says why)
    load = Load(opts.ip, opts.clients, seconds, workdir, opts.ledger_connections,
                think_ms=opts.interval_ms if opts.protect else 0)
    obs["load"] = load
    say(f"load: pgbench ({opts.clients} clients) + commit ledger ({opts.ledger_connections} "
        f"connections) for {seconds:g} s; failure at "
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
        load.check_running()
        obs["activity_before"], raw = activity_snapshot(opts.ip)
        (workdir / "pg_stat_activity-before.json").write_text(raw)
        if opts.protect and opts.mode == "switchover":
            obs["failure_at"] = time.time()
            say("SWITCHOVER requested" + (" (UNSAFE: its last epoch's output released one "
                                         "epoch early)" if opts.release_early else ""))
            try:
                obs["switchover"] = switchover.handover(
                    opts.vm_name, "primary", SWITCHOVER_STEP_TIMEOUT_S,
                    unsafe_release_early=opts.release_early,
                    steps=switchover.Steps(progress=say))
                obs["replica"] = obs["switchover"]["replica"]
                # the "failure" is the primary's switchover request (the checks before it
                # leave the VM running)
                obs["failure_at"] = obs["switchover"]["requested_at_unix"] or obs["failure_at"]
                say("the backup runs the VM")
            except ProtectionError as e:
                obs["takeover_error"] = str(e)
                say(f"no switchover: {e}")
        elif opts.protect:
            try:
                obs["failure_at"] = injection.inject()
            except (InjectError, OSError, subprocess.CalledProcessError) as e:
                raise DrillError(f"could not inject the failure ({opts.mode}): {e}")
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
            run_until(load, time.time() + AFTER_SNAPSHOT_DELAY_S, strict=False)
            obs["activity_after"], raw = activity_snapshot(
                opts.ip, deadline=max(time.time() + 5, load.planned_end - 2))
            (workdir / "pg_stat_activity-after.json").write_text(raw)
            if obs["switchover"] and not opts.release_early:
                protect_back(opts, obs)
            run_until(load, load.planned_end, strict=False)
            load.end(CONTROL_END_GRACE_S if opts.negative_control else LOAD_END_GRACE_S)
    finally:
        load.stop()
    obs["acked_ids"] = workload.ledger_acked_ids(load.ledger_file)
    if obs["switchover"]:
        obs["reverse"] = reverse_protection(opts.vm_name, obs)
    if opts.protect and obs["replica"] is not None:
        try:  # the final picture, with every failover timing filled in
            obs["replica"] = protection.replica("backup", opts.vm_name) or obs["replica"]
        except ProtectionError:
            pass
    return obs


def protect_back(opts, obs):
    """The switchover's last step, while the load goes on: the VM, now on
    the backup host, protected back to the old primary (resync)."""
    try:
        seconds, _ = switchover.protect_back(opts.vm_name, obs["switchover"],
                                             PROTECT_TIMEOUT_S,
                                             steps=switchover.Steps(progress=say))
        obs["protect_back"] = {"seconds": round(seconds, 1), "error": None}
    except ProtectionError as e:
        obs["protect_back"] = {"seconds": None, "error": str(e)}
        say(f"protecting back failed: {e}")


def reverse_protection(name, obs):
    """After a switchover, once the load ended: is the VM protected the
    other way round (the backup host its primary, the old primary holding
    a ready replica), and how was its disk copied?"""
    old, new = obs["switchover"]["from"], obs["switchover"]["to"]
    out = {"runs_on": new, "backup": old, "protect_s": (obs["protect_back"] or {}).get("seconds"),
           "error": (obs["protect_back"] or {}).get("error"), "state": None, "peer": None,
           "disk_copy": None, "replica_state": None, "old_primary_qemu_running": None}
    try:
        p = protection.primary_protection(new, name) or {}
        out.update(state=p.get("state"), peer=p.get("peer"), disk_copy=p.get("disk_copy"),
                   expected_peer=protection.parse_backup(old))
        out["replica_state"] = (protection.replica(old, name) or {}).get("state")
        out["old_primary_qemu_running"] = protection.qemu_running(old, name)
    except ProtectionError as e:
        out["error"] = out["error"] or str(e)
    return out


def measure(opts, meta, protect_s, obs, workdir):
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
    takeover = bool(replica) and replica.get("state") == "active"
    takeover_ms = fo.get("total_ms")
    resumed = fo.get("resumed_at_unix")
    if resumed is None and takeover_ms is not None:
        resumed = fail_at + takeover_ms / 1000
    if not opts.protect:
        resumed = fail_at  # the would-be failure: nothing to take over
    start, end, recovered = outage(ack_times, fail_at, stop_at, resumed)
    detection_ms = fo.get("detected_ms_after_last_heard")
    declared = fo.get("started_at_unix")

    before = obs["activity_before"]
    surv = (survival(before, obs["activity_after"], load.pgbench_commits(), load.acks.acks,
                     resumed if (takeover or not opts.protect) else None,
                     ledger_connections=opts.ledger_connections,
                     ledger_error_workers=ledger_workers_with_errors(load.ledger_out.lines,
                                                                     since=fail_at))
            if before is not None else None)
    # a process the drill stopped (no takeover: nothing to wait for) did not end early
    early = ended_early({name: t for name, t in load.exit_times.items()
                         if name not in load.signalled}, load.planned_end)
    collapsed = ("; ".join(f"{name} ended {s:g} s before the load's planned end"
                           for name, s in sorted(early.items())) or None)

    acked = obs["acked_ids"]
    # without a takeover the database is most likely gone: one try only
    present = ledger_ids_in_db(opts.ip, tries=5 if obs["takeover_error"] is None else 1)
    lost = None if present is None else sorted(set(acked) - present)
    # None: not run, because the database does not answer
    clean, amcheck_text = amcheck(opts.ip) if present is not None else (None, None)

    console_errors = guest_kernel_errors("backup" if replica else "primary", opts.vm_name)
    p = obs["primary_before"] or {}
    rel = lambda t: None if t is None else round(t - t0, 3)  # noqa: E731
    s = surv or {}
    result = base_result(opts, workdir)
    result.update({
        "accel": meta.get("accel"),
        "guest_vcpus_online": meta.get("guest_vcpus_online"),
        "protect_s": protect_s,
        "failure_at_s": rel(fail_at),
        "failure_at_unix": fail_at,
        "takeover": takeover,
        "takeover_ms": takeover_ms,
        "restore": (fo or {}).get("restore"),
        "takeover_error": obs["takeover_error"],
        "failover": fo or None,
        "detection_ms": detection_ms,
        "detection_after_failure_ms": (None if declared is None
                                       else round((declared - fail_at) * 1000, 1)),
        "peer_timeout_ms": p.get("peer_timeout_ms"),
        "max_peer_silence_ms_before": p.get("max_peer_silence_ms"),
        "replica_committed_epoch": replica.get("committed_epoch"),
        "acked_commits": len(acked),
        "lost_acked_commits": None if lost is None else len(lost),
        "lost_acked_ids": None if lost is None else lost[:50],
        "downtime_ms": round((end - start) * 1000, 1),
        "clients_recovered": recovered,
        "pgbench_before": s.get("pgbench_before"),
        "pgbench_survived": s.get("pgbench_survived"),
        "ledger_before": s.get("ledger_before"),
        "ledger_survived": s.get("ledger_survived"),
        "connections_before": (None if surv is None
                               else s["pgbench_before"] + s["ledger_before"]),
        "connections_survived": (None if surv is None
                                 else s["pgbench_survived"] + s["ledger_survived"]),
        "survival": surv,
        "pgbench_aborted_clients": sorted(aborted),
        "pgbench_exit": load.pgbench.returncode,
        "pgbench_log_complete": "pgbench" not in load.signalled,
        "ledger_reconnects": len(ledger_errors),
        "load_ended_early_s": early or None,
        "load_collapsed": collapsed,
        "tps_before": mean_tps(progress, fail_at - WINDOW_S, fail_at),
        "tps_after": mean_tps(progress, max(resumed or fail_at, stop_at - WINDOW_S),
                              stop_at) or 0.0,
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
            "outage_s": [rel(start), rel(end)],
        },
    })
    so = obs.get("switchover")
    if opts.mode == "switchover":
        result["switchover"] = None if not so else {
            "from": so["from"], "to": so["to"], "epoch": so["epoch"],
            "held_epoch": so["held_epoch"], "steps": so["steps"],
            # the clients' stall above is the measure; these are the daemons' view
            "request_to_resume_ms": (None if resumed is None
                                     else round((resumed - fail_at) * 1000, 1)),
            "vm_paused_ms": (None if resumed is None or so.get("stopped_at_unix") is None
                             else round((resumed - so["stopped_at_unix"]) * 1000, 1)),
            "primary_switchover": so["primary_switchover"]}
        result["reverse_protection"] = obs.get("reverse")
    return result


def base_result(opts, workdir):
    """The fields every result has, a failed drill's too."""
    return {
        "drill": "switchover" if opts.mode == "switchover" else "failover",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "mode": opts.mode if opts.protect else "none (--no-protect dry run)",
        "vm": opts.vm_name, "ip": opts.ip, "accel": None, "from_saved": opts.from_saved,
        "mem_mb": opts.mem_mb, "cpus": opts.cpus, "fill_mb": opts.fill_mb,
        "guest_load": list(opts.guest_load) or None,
        "interval_ms": opts.interval_ms if opts.protect else None,
        "output_commit": opts.output_commit if opts.protect else None,
        "unsafe_release_early": opts.release_early if opts.protect else None,
        "negative_control": opts.negative_control if opts.protect else None,
        "protected": opts.protect, "protect_s": None,
        "clients": opts.clients,
        "ledger_connections": opts.ledger_connections,
        "workdir": None if workdir is None else str(workdir),
        "failed_reason": None,
        "power_cut": None,
    }


def failed_result(opts, workdir, reason, partial=None):
    """A drill that could not be carried out, as a result: it counts."""
    r = base_result(opts, workdir)
    for key in ("takeover", "takeover_ms", "acked_commits", "lost_acked_commits",
                "downtime_ms", "clients_recovered", "detection_ms", "peer_timeout_ms",
                "pgbench_before", "pgbench_survived", "ledger_before", "ledger_survived",
                "connections_before", "connections_survived", "amcheck_clean",
                "guest_kernel_errors", "failure_at_s", "load_collapsed"):
        r[key] = None
    r.update(partial or {})
    r["failed_reason"] = reason
    r["passed"], r["verdict"] = False, f"FAIL: the drill broke off: {reason}"
    return r


def verdict(opts, r):
    problems = []
    if r.get("failed_reason"):
        problems.append(f"the drill broke off: {r['failed_reason']}")
    if not r.get("acked_commits"):
        problems.append("no commit was acknowledged")
    if r.get("lost_acked_commits") is None:
        problems.append("could not check the acknowledged commits (database unreachable)")
    elif r["lost_acked_commits"]:
        problems.append(f"{r['lost_acked_commits']} acknowledged commits LOST")
    if r.get("amcheck_clean") is None:
        problems.append("pg_amcheck not run")
    elif not r["amcheck_clean"]:
        problems.append("pg_amcheck found problems")
    if r.get("guest_kernel_errors"):
        problems.append(f"the guest kernel logged {len(r['guest_kernel_errors'])} errors")
    if opts.protect and opts.output_commit and not r.get("takeover"):
        problems.append("no takeover")
    if r.get("load_collapsed"):
        problems.append(f"the load collapsed: {r['load_collapsed']}")
    # Remus keeps every connection: one that broke or hung after the
    # takeover saw output the resumed VM never produced (or the VM is lost)
    before, survived = r.get("connections_before"), r.get("connections_survived")
    if opts.protect and before is not None and (survived or 0) < before:
        problems.append(f"only {survived} of {before} connections survived (pgbench "
                        f"{r.get('pgbench_survived')} of {r.get('pgbench_before')}, ledger "
                        f"{r.get('ledger_survived')} of {r.get('ledger_before')})")
    if opts.protect and opts.mode == "switchover":
        problems += switchover_problems(r)
    cut = r.get("power_cut")
    if opts.protect and opts.mode == "power":
        if not cut:
            problems.append("no evidence that the power cut held")
        elif cut.get("lan_frames_from_primary_after_cut"):
            problems.append(f"{cut['lan_frames_from_primary_after_cut']} frames left the "
                            f"primary after the power cut")
    return (not problems, "PASS" if not problems else "FAIL: " + "; ".join(problems))


def switchover_problems(r):
    """A switchover ends with the VM resumed from exactly the checkpoint the
    primary stopped at, the old primary's QEMU gone, and the VM protected
    the other way round."""
    so, rev = r.get("switchover"), r.get("reverse_protection")
    if not so:
        return ["no switchover"]
    problems = []
    if r.get("replica_committed_epoch") != so["epoch"]:
        problems.append(f"the backup resumed epoch {r.get('replica_committed_epoch')}, not the "
                        f"stopped checkpoint's {so['epoch']}")
    if (so.get("primary_switchover") or {}).get("state") != "handed-over":
        problems.append(f"the old primary's switchover is "
                        f"{(so.get('primary_switchover') or {}).get('state')}")
    if not rev:
        return problems + ["the VM was not protected back"]
    if rev.get("old_primary_qemu_running"):
        problems.append("the old primary's QEMU still runs")
    if rev.get("state") != "protected" or rev.get("peer") != rev.get("expected_peer") \
            or rev.get("replica_state") != "ready":
        problems.append(f"not protected the other way round: {rev['runs_on']}'s protection "
                        f"{rev.get('state')} to {rev.get('peer')}, {rev['backup']}'s replica "
                        f"{rev.get('replica_state')} ({rev.get('error')})")
    return problems


def prepare_lab(opts):
    vm.check_name(opts.vm_name)
    lab_up(opts.protect)
    remove_leftover_cut()
    vm.ensure_daemon("primary")
    if opts.protect and opts.restore:
        # The backup daemon restores the way asked: restarted with it.
        vm.stop_daemon("backup")
        extra = [a for a in os.environ.get("REMUSDBD_EXTRA_ARGS", "").split()
                 if not a.startswith("--restore")]
        os.environ["REMUSDBD_EXTRA_ARGS"] = " ".join(extra + [f"--restore={opts.restore}"])
        try:
            vm.ensure_daemon("backup")
        finally:
            os.environ["REMUSDBD_EXTRA_ARGS"] = " ".join(extra)
    if opts.protect:
        vm.ensure_daemon("backup")
    stop_vm_everywhere(opts.vm_name)
    forget_backup_console(opts.vm_name)
    if opts.protect:
        check_backup_free(opts.vm_name)
        forget_ownership(opts.vm_name)


def run(opts):
    """The whole drill; returns its result (see measure()), a failed one
    (failed_result()) when the drill could not be carried out. Leaves the
    lab up; stops the VM on both hosts unless opts.keep."""
    if opts.mode not in MODES:
        raise DrillError(f"unknown mode {opts.mode!r}: use one of {', '.join(MODES)}")
    workdir = make_workdir(opts)
    say(f"work directory {workdir}")
    injection = None if opts.mode == "switchover" else Injection(opts.mode, opts.vm_name)
    result = None
    try:
        prepare_lab(opts)
        meta, protect_s = boot_and_protect(opts)
        obs = exercise(opts, workdir, injection)
        result = measure(opts, meta, protect_s, obs, workdir)
    except (DrillError, ProtectionError, InjectError, SystemExit) as e:
        say(f"the drill broke off: {e}")
        result = failed_result(opts, workdir, str(e) or type(e).__name__)
    except Exception as e:  # noqa: BLE001 -- a series must go on; the reason is kept
        say(f"the drill broke off: {type(e).__name__}: {e}")
        result = failed_result(opts, workdir, f"{type(e).__name__}: {e}")
    finally:
        cleanup_notes = cleanup(opts, injection)
    if cleanup_notes.get("power_cut") is not None:
        result["power_cut"] = cleanup_notes["power_cut"]
    if cleanup_notes.get("errors"):
        result["cleanup_errors"] = cleanup_notes["errors"]
    if not result.get("failed_reason"):
        result["passed"], result["verdict"] = verdict(opts, result)
    workload.save_json(workdir / "result.json", result)
    return result


def cleanup(opts, injection):
    """Stops the VM (unless --keep), reads the power cut's evidence and
    only then gives the old primary its network back: its VM and daemon
    are gone by then, so it never meets the new primary on the LAN."""
    notes = {"power_cut": None, "errors": []}
    if opts.keep:
        say(f"--keep: {opts.vm_name} left running (tools/remusdb status shows where)")
    else:
        stop_vm_everywhere(opts.vm_name)
    if injection is None:  # a switchover: nothing was cut, the old primary holds a replica
        if not opts.keep:
            try:
                protection.request("primary", "forget", vm=opts.vm_name)
            except ProtectionError:
                pass  # none left, or still in use: the daemon retires it later
        return notes
    try:
        notes["power_cut"] = injection.evidence()
    except (InjectError, subprocess.CalledProcessError, ValueError, KeyError) as e:
        notes["errors"].append(f"reading the power cut's counters: {e}")
    try:
        injection.undo()  # never leave the shared lab cut, even with --keep
    except (InjectError, subprocess.CalledProcessError) as e:
        notes["errors"].append(f"restoring the primary's network: {e}")
    for e in notes["errors"]:
        say(e)
    return notes
