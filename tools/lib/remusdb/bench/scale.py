"""remusdb-bench scale: how protection and takeover grow with guest RAM,
and how protections share a host as their number grows (issue 23, item
6), in one run under one load throughout: pgbench (2 clients) and the
commit ledger from the client host, and rdb-dirty in every guest at one
fixed rate (--dirty-rate MiB/s, --dirty-mode).

Against RAM (--sizes, MiB): per size, one failover drill (drill/failover.py:
power cut, detection by heartbeats) per restore mode (--modes), the guest
restored from its saved image so that it uses the same RAM at every size.
From each drill: the checkpoint pause p50/p99 and its bitmap-sync part
(status' pause_parts) and bytes per epoch just before the cut, the initial
sync (protect -> PROTECTED), takeover, client-visible downtime and lost
acknowledged commits. Beside it a sampler reads the backup every 0.25 s:
remusdbd's resident set per protected GiB (status' memory) and the
proportional set size of everything the backup host runs (remusdbd, its
children, QEMUs), whose peak during the takeover is the image and the new
QEMU side by side.

Against the number of VMs (--counts): VMs of 1 GiB, placed alternately on
the primary and the backup host and each protected to the other host, are
added until N run; each N gets a fresh window of --seconds under the load
on every VM: epochs/s per VM, pause p99, the heartbeat gaps both sides
count (p99), false failovers (a state change of any protection or replica
during the window: must be 0) and the CPU each host's processes used.

A drill or window that broke off, or whose load acknowledged nothing, is
kept as failed, never dropped.
"""
import os
import statistics
import textwrap
import threading
import time
from functools import partial
from pathlib import Path

from .. import guest_agent, output, paths, protection
from ..drill import failover
from ..drill.inject import InjectError, host_pids
from ..drill.lab import forget_ownership, lab_up, stop_vm_everywhere
from ..failback import address, forget_replica_files, other
from ..lab import netns, vm, workload
from ..lab.sched_groups import group_niced, short_slices
from ..protection import ProtectionError
from ..qmp import QMP
from . import colo_trace, loop_profile
from .harness import cpu_seconds, csv_ints, result_head
from .plot import pyplot

say = partial(output.say, "bench scale")

RAM_VM = "scale"
COUNT_VMS = [(f"scale{i}", ("primary", "backup")[(i - 1) % 2], f"{netns.SUBNET_PREFIX}.{40 + i}")
             for i in range(1, 5)]
RDB_DIRTY = "/usr/local/bin/rdb-dirty"
DIRTY_BUFFER_MB = 64
PGBENCH_CLIENTS = 2
LEDGER_CONNECTIONS = 2
INTERVAL_MS = 100
# The busy neighbour's epochs. QEMU's COLO timer fires every interval
# after it last fired, in whole ms (migration/colo.c,
# colo_checkpoint_notify), so two VMs with one interval keep the offset
# between their checkpoints that their protections started with: their
# pauses then overlap in every epoch or in none, by chance. A 3 ms
# difference sweeps every offset in about 33 epochs, so each window
# measures them all.
BUSY_INTERVAL_MS = 97
SAMPLE_S = 0.25
STATE_EVERY_S = 2.0
PROTECT_TIMEOUT_S = 900
# A drill's guest load outlasts the drill's own load (failure + budget + after).
GUEST_LOAD_SLACK_S = 120
TAKEOVER_PEAK_WINDOW_S = 30
PAGE = 4096
BUSY_CLIENTS = 8
BUSY_DIRTY_MB = 32
# In the busy guest: 64 KiB writes, each made durable before the next
# (oflag=dsync: a write, then an NBD FLUSH or FUA), over one 64 MiB file
# for {s} seconds. Not bound by the network as pgbench's commits are.
BUSY_SYNC_WRITER = ("end=$(($(date +%s)+{s})); while [ $(date +%s) -lt $end ]; do "
                    "dd if=/dev/zero of=/var/tmp/busy-sync bs=64k count=1024 oflag=dsync "
                    "conv=notrunc 2>/dev/null; done; rm -f /var/tmp/busy-sync")


def disk_flushes(host, name):
    """The NBD FLUSHes (FUA writes included) remusdbd answered for the VM's disk."""
    for v in protection.status(host).get("vms", []):
        if v.get("name") == name:
            return sum(d.get("flushes") or 0 for d in v.get("disks") or [])
    return 0


def add_parser(sub):
    b = sub.add_parser("scale", help="pause, sync, memory and takeover against guest RAM; "
                       "epochs, pauses, heartbeats and CPU against the number of VMs")
    b.add_argument("--sizes", default="1024,2048,4096,8192",
                   help="guest RAM sizes in MiB (default 1024,2048,4096,8192)")
    b.add_argument("--modes", default="shared,eager,lazy",
                   help="restore modes drilled at each size (default shared,eager,lazy)")
    b.add_argument("--counts", default="1,2,4",
                   help="numbers of VMs protected at once (default 1,2,4; empty: none)")
    b.add_argument("--seconds", type=int, default=40,
                   help="measured seconds per VM-count window (default 40)")
    b.add_argument("--dirty-rate", type=float, default=8.0,
                   help="rdb-dirty's rate in every guest, MiB/s (default 8)")
    b.add_argument("--dirty-mode", choices=("sparse", "dense"), default="sparse")
    b.add_argument("--no-neighbour", action="store_true",
                   help="skip the quiet VM alone / beside a busy one / alone windows")
    b.add_argument("--loop-profile", action="store_true",
                   help="one more neighbour window beside the busy VM with both daemons' "
                   "loop threads sampled by perf: whose handlers hold the loop (its pause "
                   "figures are perturbed by perf and judge nothing)")
    b.add_argument("--qemu-trace", action="store_true",
                   help="the quiet VM's QEMU traces each checkpoint's steps (colo_trace.py): "
                   "every neighbour window gets the phases of its pause by QEMU's clock")
    b.add_argument("--out", default=None, help="output stem (default docs/bench/scale)")
    return b


def rdb_dirty_argv(args, seconds):
    return (RDB_DIRTY, "--buffer-mb", str(DIRTY_BUFFER_MB), "--rate-mb", f"{args.dirty_rate:g}",
            "--seconds", str(int(seconds)), "--mode", args.dirty_mode)


# ------------------------------------------------------------ host readings

def host_processes(host):
    """Every process of the host: its QEMUs, remusdbd and the daemon's
    children (what a power cut of it kills); () without a daemon."""
    try:
        return host_pids(None, host)
    except InjectError:
        return ()


def pss_bytes(pid):
    """The process's proportional set size: a page it shares with another
    process (a shared restore's image, mapped by remusdbd and QEMU) counts
    half to each, so a sum over processes counts it once."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class BackupSampler(threading.Thread):
    """Every SAMPLE_S: the backup remusdbd's memory report and the PSS of
    every process of the backup host."""

    def __init__(self, host="backup"):
        super().__init__(daemon=True)
        self.host = host
        self.samples = []
        self.stopping = threading.Event()

    def run(self):
        while not self.stopping.wait(SAMPLE_S):
            t = time.time()
            try:
                mem = protection.request(self.host, "status", timeout=2).get("memory") or {}
            except (ProtectionError, OSError):
                mem = {}
            pss = sum(pss_bytes(pid) for pid in host_processes(self.host))
            self.samples.append({"t": t, "daemon_rss_bytes": mem.get("daemon_rss_bytes"),
                                 "protected_ram_bytes": mem.get("protected_ram_bytes"),
                                 "host_pss_bytes": pss})

    def stop(self):
        self.stopping.set()
        self.join(timeout=5)

    def summary(self, failure_at):
        """Before the failure: the last sample with a protected replica;
        after it: the peak host PSS within the takeover window."""
        before = [s for s in self.samples if failure_at is None or s["t"] < failure_at]
        held = [s for s in before if s["protected_ram_bytes"] and s["daemon_rss_bytes"]]
        last = held[-1] if held else {}
        after = ([s for s in self.samples if failure_at <= s["t"] <= failure_at
                  + TAKEOVER_PEAK_WINDOW_S] if failure_at else [])
        gib = (last.get("protected_ram_bytes") or 0) / (1 << 30)
        return {
            "daemon_rss_bytes": last.get("daemon_rss_bytes"),
            "protected_ram_bytes": last.get("protected_ram_bytes"),
            # bytes per protected GiB, as status reports it; and the plain ratio (goal <= 1.15)
            "daemon_rss_per_protected_gib": (last["daemon_rss_bytes"] / gib) if gib else None,
            "daemon_rss_over_protected_ram": (last["daemon_rss_bytes"]
                                              / last["protected_ram_bytes"]) if gib else None,
            "host_pss_bytes_before": last.get("host_pss_bytes"),
            "host_pss_bytes_peak_takeover": max((s["host_pss_bytes"] for s in after),
                                                default=None),
            "samples": len(self.samples),
        }


# ------------------------------------------------------------ against RAM

def ram_drill(args, size_mb, mode, index):
    seconds = 20 + failover.TAKEOVER_BUDGET_S + 20 + GUEST_LOAD_SLACK_S
    opts = failover.DrillOptions(vm_name=RAM_VM, restore=mode, index=index, mem_mb=size_mb,
                                 interval_ms=INTERVAL_MS, failure_at_s=20.0, after_s=20.0,
                                 clients=PGBENCH_CLIENTS, ledger_connections=LEDGER_CONNECTIONS,
                                 from_saved=True, guest_load=rdb_dirty_argv(args, seconds))
    sampler = BackupSampler()
    sampler.start()
    try:
        r = failover.run(opts)
    finally:
        sampler.stop()
    p = r.get("primary_status_before_failure") or {}
    parts = p.get("pause_parts") or {}
    fo = r.get("failover") or {}
    run = {"mem_mb": size_mb, "restore": mode, "passed": bool(r.get("passed")),
           "accel": r.get("accel"),
           "verdict": r.get("verdict"), "failed_reason": r.get("failed_reason"),
           "restored_as": fo.get("restore"),
           "initial_sync_s": r.get("protect_s"),
           "epochs": r.get("epochs"),
           "pause_ms_p50": r.get("pause_ms_p50"), "pause_ms_p99": r.get("pause_ms_p99"),
           "bitmap_sync_ms_p50": parts.get("bitmap_sync_ms_p50"),
           "bitmap_sync_ms_p99": parts.get("bitmap_sync_ms_p99"),
           "stop_ms_p99": parts.get("stop_ms_p99"),
           "bytes_per_epoch_mean": r.get("bytes_per_epoch_mean"),
           "dirty_pages_per_epoch_mean": p.get("dirty_pages_per_epoch_mean"),
           "takeover_ms": r.get("takeover_ms"), "restore_ms": fo.get("restore_ms"),
           "stream_bytes": fo.get("stream_bytes"),
           "downtime_ms": r.get("downtime_ms"),
           "acked_commits": r.get("acked_commits"),
           "lost_acked_commits": r.get("lost_acked_commits"),
           "backup_memory": sampler.summary(r.get("failure_at_unix")),
           "workdir": r.get("workdir")}
    if run["passed"] and mode != "lazy" and run["restored_as"] != mode:
        run["passed"] = False
        run["failed_reason"] = f"asked to restore {mode}, the backup restored {run['restored_as']}"
    if run["passed"] and not run["acked_commits"]:
        run["passed"] = False
        run["failed_reason"] = "the load acknowledged no commit"
    m = run["backup_memory"]
    say(f"{size_mb} MiB, {mode}: pause p50/p99 {run['pause_ms_p50']}/{run['pause_ms_p99']} ms "
        f"(bitmap sync p99 {run['bitmap_sync_ms_p99']} ms), initial sync "
        f"{run['initial_sync_s']} s, backup RSS / protected RAM "
        f"{m['daemon_rss_over_protected_ram']}, "
        f"takeover {run['takeover_ms']} ms, downtime {run['downtime_ms']} ms, lost "
        f"{run['lost_acked_commits']} of {run['acked_commits']}: "
        f"{run['verdict'] or run['failed_reason']}")
    return run


def ram_summary(runs, sizes, modes):
    def med(rows, key):
        vals = [r[key] for r in rows if r.get(key) is not None]
        return statistics.median(vals) if vals else None
    out = {}
    for size in sizes:
        rows = [r for r in runs if r["mem_mb"] == size and r["passed"]]
        mems = [r["backup_memory"] for r in rows]
        out[str(size)] = {
            "drills": sum(r["mem_mb"] == size for r in runs), "passed": len(rows),
            **{k: med(rows, k) for k in ("pause_ms_p50", "pause_ms_p99", "bitmap_sync_ms_p50",
                                         "bitmap_sync_ms_p99", "bytes_per_epoch_mean",
                                         "initial_sync_s")},
            "daemon_rss_over_protected_ram": med(mems, "daemon_rss_over_protected_ram"),
            "host_pss_bytes_peak_takeover": {
                r["restore"]: r["backup_memory"]["host_pss_bytes_peak_takeover"] for r in rows},
            "takeover_ms": {r["restore"]: r["takeover_ms"] for r in rows},
            "downtime_ms": {r["restore"]: r["downtime_ms"] for r in rows},
        }
    return out


# ------------------------------------------------------------ against N

def start_count_vm(name, host, ip, interval_ms=INTERVAL_MS):
    stop_vm_everywhere(name)
    forget_ownership(name)
    forget_replica_files(name)
    vm.start(name, host, ip=ip, from_saved=True, wait_timeout=400)
    protection.protect(name, address(other(host)), interval_ms, host=host)
    protection.wait_protected(name, host, PROTECT_TIMEOUT_S)
    say(f"{name} runs on {host} ({ip}), protected to {other(host)} ({interval_ms} ms epochs)")


def states(vms):
    """Each VM's protection state on its host and its replica's on the other."""
    out = {}
    for name, host, _ in vms:
        try:
            p = protection.primary_protection(host, name) or {}
            r = protection.replica(other(host), name) or {}
            out[name] = (p.get("state"), r.get("state"))
        except ProtectionError as e:
            out[name] = ("status failed", str(e)[:80])
    return out


def count_window(args, vms, workdir):
    n = len(vms)
    seconds = args.seconds
    loads, dirty = {}, {}
    for name, host, ip in vms:
        d = workdir / f"n{n}-{name}"
        d.mkdir(parents=True, exist_ok=True)
        loads[name] = failover.Load(ip, PGBENCH_CLIENTS, seconds + 10, d,
                                    ledger_connections=LEDGER_CONNECTIONS, think_ms=INTERVAL_MS)
        dirty[name] = (host, guest_agent.start(str(vm.vm_files(host, name)["qga"]),
                                               list(rdb_dirty_argv(args, seconds + 15))))
    time.sleep(5)  # the clients connected, rdb-dirty touched its buffer
    for name, host, _ in vms:
        protection.reset_stats(name, host)
    before = {name: len(loads[name].acks.acks) for name, _, _ in vms}
    pids = {h: host_processes(h) for h in ("primary", "backup")}
    cpu0 = {h: cpu_seconds(p) for h, p in pids.items()}
    t0 = time.monotonic()
    first = states(vms)
    changes = []
    while time.monotonic() - t0 < seconds:
        time.sleep(STATE_EVERY_S)
        now = states(vms)
        for name in now:
            if now[name] != first[name]:
                changes.append({"vm": name, "at_s": round(time.monotonic() - t0, 1),
                                "from": first[name], "to": now[name]})
                first[name] = now[name]
    elapsed = time.monotonic() - t0
    cpu = {h: round((cpu_seconds(p) - cpu0[h]) / elapsed, 3) for h, p in pids.items()}
    per_vm = []
    for name, host, _ in vms:
        p = protection.primary_protection(host, name) or {}
        r = protection.replica(other(host), name) or {}
        hb_p, hb_b = p.get("heartbeat") or {}, r.get("heartbeat") or {}
        per_vm.append({
            "vm": name, "host": host, "state": p.get("state"),
            "epochs_per_s": (p.get("epochs_since_reset") or 0) / elapsed,
            "pause_ms_p50": p.get("pause_ms_p50"), "pause_ms_p99": p.get("pause_ms_p99"),
            "bitmap_sync_ms_p99": (p.get("pause_parts") or {}).get("bitmap_sync_ms_p99"),
            "heartbeat_gap_ms_p99_primary": hb_p.get("silence_p99_ms"),
            "heartbeat_gap_ms_p99_backup": hb_b.get("silence_p99_ms"),
            "heartbeat_gap_ms_max": max((x for x in (hb_p.get("max_silence_ms"),
                                                     hb_b.get("max_silence_ms"))
                                         if x is not None), default=None),
            "acked_in_window": len(loads[name].acks.acks) - before[name],
        })
    for name, load in loads.items():
        load.stop()
    for name, (host, pid) in dirty.items():
        try:
            guest_agent.finish(str(vm.vm_files(host, name)["qga"]), pid, timeout=60)
        except Exception as e:  # noqa: BLE001 -- recorded, the window's figures stand
            say(f"{name}: rdb-dirty did not finish cleanly: {e}")
    empty = [v["vm"] for v in per_vm if not v["acked_in_window"]]
    problems = ([f"false failover or state change: {c}" for c in changes]
                + [f"{v['vm']} is {v['state']}, not protected" for v in per_vm
                   if v["state"] != "protected"]
                + [f"{name}: the load acknowledged nothing in the window" for name in empty])
    window = {"vms": n, "seconds": round(elapsed, 1), "per_vm": per_vm,
              "cpu_cores_by_host": cpu, "state_changes": changes,
              "false_failovers": len(changes), "passed": not problems, "problems": problems}
    say(f"N={n}: epochs/s per VM {[round(v['epochs_per_s'], 1) for v in per_vm]}, pause p99 "
        f"{[v['pause_ms_p99'] for v in per_vm]} ms, heartbeat gap p99 "
        f"{[v['heartbeat_gap_ms_p99_primary'] for v in per_vm]} ms, CPU {cpu}, "
        f"{'passed' if not problems else problems}")
    return window


def count_runs(args, counts, workdir):
    windows = []
    running = []
    lab_up(need_witness=True)
    for host in ("primary", "backup"):
        vm.ensure_daemon(host)
    try:
        for n in counts:
            try:
                while len(running) < n:
                    spec = COUNT_VMS[len(running)]
                    start_count_vm(*spec)
                    running.append(spec)
                windows.append(count_window(args, list(running), workdir))
            except (ProtectionError, SystemExit, OSError, RuntimeError) as e:
                say(f"N={n} broke off: {e}")
                windows.append({"vms": n, "passed": False, "problems": [f"broke off: {e}"]})
                break
    finally:
        for name, _, _ in running:
            stop_vm_everywhere(name)
    return windows


# ------------------------------------------------------------ the noisy neighbour

def loop_reading(host):
    """The host's remusdbd's loop turns (status "loop"), cumulative; None
    from a daemon without them."""
    try:
        return protection.status(host).get("loop")
    except (ProtectionError, OSError):
        return None


def loop_window(before, after):
    """What the loop did between two readings: the share of the time it was
    busy, the turns that held it past 1, 2.5 and 5 ms, and the bound below
    which 99% of the window's turns ended."""
    if not before or not after or after["count"] <= before["count"]:
        return None
    turns = after["count"] - before["count"]
    cum = [a - b for a, b in zip(after["cumulative"], before["cumulative"])]
    bounds = after["bounds_ms"]

    def past(ms):
        i = bounds.index(ms)
        return turns - cum[i]
    p99 = next((b for b, c in zip(bounds, cum) if c >= 0.99 * turns), None)
    wall = after["counted_for_ms"] - before["counted_for_ms"]
    return {"turns": turns, "busy_share": round((after["busy_ms"] - before["busy_ms"]) / wall, 4),
            "turns_past_1ms": past(1), "turns_past_2_5ms": past(2.5), "turns_past_5ms": past(5),
            "turn_p99_bound_ms": p99}


def quiet_window(args, name, host, ip, label):
    """The quiet VM's own numbers over one window: pgbench's commit latency
    (output commit holds every acknowledgement for its epoch) and its
    checkpoint pauses."""
    protection.reset_stats(name, host)
    pids = host_processes(host)
    loops0 = {h: loop_reading(h) for h in ("primary", "backup")}
    cpu0, t0, wall0 = cpu_seconds(pids), time.monotonic(), time.time()
    r = workload.pgbench(ip, seconds=args.seconds, clients=PGBENCH_CLIENTS, threads=1)
    cpu = round((cpu_seconds(pids) - cpu0) / (time.monotonic() - t0), 3)
    wall1 = time.time()
    loops = {h: loop_window(loops0[h], loop_reading(h)) for h in ("primary", "backup")}
    p = protection.primary_protection(host, name) or {}
    w = {"window": label, "tps": r["tps"], "latency_ms": r["latency_ms"],
         "transactions": r["transactions"], "pgbench_exit": r["exit_code"],
         "pause_ms_p50": p.get("pause_ms_p50"), "pause_ms_p99": p.get("pause_ms_p99"),
         "bitmap_sync_ms_p99": (p.get("pause_parts") or {}).get("bitmap_sync_ms_p99"),
         "stop_ms_p99": (p.get("pause_parts") or {}).get("stop_ms_p99"),
         # QEMU's request to our answer, its guest running (backpressure).
         "request_wait_ms_p50": (p.get("pause_parts") or {}).get("request_wait_ms_p50"),
         "request_wait_ms_p99": (p.get("pause_parts") or {}).get("request_wait_ms_p99"),
         # REPLY to QEMU's RESUME: the pause as the guest has it
         "guest_pause_ms_p99": (p.get("pause_parts") or {}).get("guest_pause_ms_p99"),
         "resume_ms_p99": (p.get("pause_parts") or {}).get("resume_ms_p99"),
         "epochs": p.get("epochs_since_reset"), "state": p.get("state"),
         "cpu_cores_host": cpu, "loop": loops, "pause_boost": p.get("pause_boost")}
    if args.qemu_trace:
        w["qemu_phases"] = colo_trace.read_summary(vm.vm_files(host, name)["qemu_log"],
                                                   wall0, wall1)
    w["passed"] = bool(r["exit_code"] == 0 and r["transactions"] and w["state"] == "protected")
    say(f"quiet VM {label}: pause p99 {w['pause_ms_p99']} ms, to RESUME "
        f"{w['guest_pause_ms_p99']} (stop p99 {w['stop_ms_p99']}, "
        f"bitmap sync p99 {w['bitmap_sync_ms_p99']}, request wait p99 "
        f"{w['request_wait_ms_p99']}), transaction latency {w['latency_ms']} ms, "
        f"{w['tps']} tps, host CPU {cpu} cores; primary's loop {loops['primary']}")
    ph = w.get("qemu_phases")
    if ph and ph.get("checkpoints"):
        say(f"quiet VM {label}, by QEMU's trace ({ph['checkpoints']} checkpoints), p99 ms: "
            f"guest pause {ph['guest_pause_ms_p99']}; " + ", ".join(
                f"{n} {ph[n + '_ms_p99']}" for n in colo_trace.PHASES))
    return w


# alone; beside the busy VM; the same with short slices for every QEMU and
# daemon thread, then with the quiet VM's QEMU's group at nice -10; beside
# it unprotected; alone again
NEIGHBOUR_WINDOWS = 6
# --loop-profile's window, one more beside the busy VM before the control
PROFILED_WINDOW = "beside the busy VM, both daemons' loops sampled by perf"
# The quiet VM's load before its first window, unrecorded
NEIGHBOUR_WARMUP_S = 30
# EEVDF's shortest slice (the kernel clamps sched_runtime to 0.1-100 ms)
SHORT_SLICE_NS = 100_000


def busy_window(args, quiet, busy, load, label):
    """A quiet window beside the protected busy VM, with the busy VM's own
    figures; failed when the busy load acknowledged nothing."""
    name, host, _ = busy
    protection.reset_stats(name, host)
    acked0 = len(load.acks.acks)
    flushes0, t0 = disk_flushes(host, name), time.monotonic()
    w = quiet_window(args, *quiet, label)
    flushes = disk_flushes(host, name) - flushes0
    bp = protection.primary_protection(host, name) or {}
    w["busy"] = {"pause_ms_p99": bp.get("pause_ms_p99"),
                 "bytes_per_epoch_mean": bp.get("bytes_per_epoch_mean"),
                 "nbd_flushes_per_s": round(flushes / (time.monotonic() - t0), 1),
                 "state": bp.get("state"), "acked": len(load.acks.acks) - acked0}
    if not w["busy"]["acked"] or w["busy"]["state"] != "protected":
        w["passed"] = False
        w["problem"] = "the busy VM's load acknowledged nothing, or it lost protection"
    return w


def daemon_pid(host):
    return int((paths.host_run_dir(host) / "remusdbd.pid").read_text())


def qemu_pid(host, name):
    return int(vm.vm_files(host, name)["pid"].read_text())


def neighbour_runs(args, workdir):
    """The quiet VM (scale1, primary host) alone, beside a busy VM on the
    same host (scale3: pgbench with BUSY_CLIENTS clients, rdb-dirty dense
    at BUSY_DIRTY_MB MiB/s and a writer that makes every 64 KiB write
    durable before the next, BUSY_SYNC_WRITER), beside it again with the
    short slices for every QEMU and daemon thread, then with the quiet VM's QEMU's
    group at nice -10 (group_niced), beside the
    same busy VM unprotected (the control: what is left is the host's
    CPU), then alone again: the alone windows bracket the busy ones, so
    drift shows as their difference. The quiet VM's latency is pgbench's transaction latency:
    under output commit each statement's reply waits for its epoch."""
    quiet, busy = COUNT_VMS[0], COUNT_VMS[2]
    lab_up(need_witness=True)
    for host in ("primary", "backup"):
        vm.ensure_daemon(host)
    for name, _, _ in COUNT_VMS[1:]:
        stop_vm_everywhere(name)
    windows = []
    try:
        if (protection.primary_protection(quiet[1], quiet[0]) or {}).get("state") != "protected":
            start_count_vm(*quiet)
        if args.qemu_trace:
            with QMP(vm.vm_files(quiet[1], quiet[0])["qmp"], timeout=10) as q:
                colo_trace.enable(q)
        # Unrecorded: the first window after the quiet VM's start paused
        # about 1.5 times longer at p99 than the last one in every run of
        # 2026-11-28 (9.3-10.1 ms against 6.1-6.6), whatever came between.
        workload.pgbench(quiet[2], seconds=NEIGHBOUR_WARMUP_S, clients=PGBENCH_CLIENTS, threads=1)
        windows.append(quiet_window(args, *quiet, "alone"))
        start_count_vm(*busy, interval_ms=BUSY_INTERVAL_MS)
        name, host, ip = busy
        seconds = 4 * args.seconds + 90
        d = workdir / "neighbour-busy"
        d.mkdir(parents=True, exist_ok=True)
        load = failover.Load(ip, BUSY_CLIENTS, seconds, d, ledger_connections=1)
        qga = str(vm.vm_files(host, name)["qga"])
        dirty = guest_agent.start(qga, [RDB_DIRTY, "--buffer-mb", str(DIRTY_BUFFER_MB),
                                        "--rate-mb", str(BUSY_DIRTY_MB), "--seconds",
                                        str(seconds), "--mode", "dense"])
        syncer = guest_agent.start(qga, ["/bin/sh", "-c", BUSY_SYNC_WRITER.format(s=seconds)])
        time.sleep(8)
        windows.append(busy_window(args, quiet, busy, load, "beside the busy VM"))
        # Short slices (EEVDF's latency hint, sched_attr.sched_runtime) for
        # every thread of both VMs' QEMUs and of both daemons: a thread that
        # wakes then preempts sooner, and no one's share of the CPU changes.
        # The quiet VM's pause is a chain of wakeups (our reply, QEMU's
        # migration thread, its vCPU's stop, our loop's read), each of
        # which may wait out a running thread's slice (1.4 ms by default
        # on two cores).
        everyone = ([daemon_pid(h) for h in ("primary", "backup")]
                    + [qemu_pid(quiet[1], quiet[0]), qemu_pid(busy[1], busy[0])])
        with short_slices(everyone, SHORT_SLICE_NS):
            windows.append(busy_window(args, quiet, busy, load, "beside the busy VM, every "
                                       f"QEMU and daemon thread at a {SHORT_SLICE_NS / 1e6:g} "
                                       "ms slice"))
        # The mechanism: the quiet VM's QEMU given a larger share. If its
        # pause comes back to its alone value, what it lost beside the busy
        # VM was CPU time at the scheduler, not any wait in our code. With
        # the daemon's pause boost on (primary/pause_boost.h) the boost
        # would overwrite the group's value at every pause, so the window
        # is then a second plain one.
        boost = ((protection.primary_protection(quiet[1], quiet[0]) or {})
                 .get("pause_boost") or {}).get("levels")
        if boost:
            windows.append(busy_window(args, quiet, busy, load,
                                       "beside the busy VM, a second window"))
        else:
            with group_niced([qemu_pid(quiet[1], quiet[0])], -10) as g:
                w = busy_window(args, quiet, busy, load, "beside the busy VM, the quiet VM's "
                                "QEMU's group at nice -10")
                w["grouping"] = g.kind
                windows.append(w)
        if args.loop_profile:
            # Which handlers hold each daemon's loop beside the busy VM: the
            # loop's thread is the daemon's main thread (tid = pid).
            recordings = {h: loop_profile.Recording(daemon_pid(h), args.seconds,
                                                    workdir / f"loop-{h}.perf")
                          for h in ("primary", "backup")}
            w = busy_window(args, quiet, busy, load, PROFILED_WINDOW)
            w["loop_profile"] = {h: r.finish() for h, r in recordings.items()}
            for h, prof in w["loop_profile"].items():
                say(f"{h}'s loop: " + (prof.get("problem") or ", ".join(
                    f"{x['handler']} {100 * x['share']:.1f}%" for x in prof["handlers"][:6])))
            windows.append(w)
        # The control: the same busy guest, unprotected. What the quiet VM
        # still loses here is the host's CPU, not the protection's work.
        protection.unprotect(name, host)
        time.sleep(3)
        acked0 = len(load.acks.acks)
        flushes0, t0 = disk_flushes(host, name), time.monotonic()
        w = quiet_window(args, *quiet, "beside the busy VM, unprotected")
        w["busy"] = {"nbd_flushes_per_s": round((disk_flushes(host, name) - flushes0)
                                                / (time.monotonic() - t0), 1),
                     "state": (protection.primary_protection(host, name) or {}).get("state"),
                     "acked": len(load.acks.acks) - acked0}
        if not w["busy"]["acked"]:
            w["passed"] = False
            w["problem"] = "the unprotected busy VM's load acknowledged nothing"
        windows.append(w)
        load.stop()
        # Sized to outlast the busy windows, which overrun their seconds:
        # ended here rather than waited for.
        try:
            guest_agent.run(qga, ["/bin/kill", str(dirty), str(syncer)], timeout=20)
        except Exception as e:  # noqa: BLE001 -- recorded, the window's figures stand
            say(f"{name}: could not end the busy VM's writers: {e}")
        for what, pid in (("rdb-dirty", dirty), ("the dsync writer", syncer)):
            try:
                guest_agent.finish(qga, pid, timeout=20)
            except Exception as e:  # noqa: BLE001 -- recorded, the window's figures stand
                say(f"{name}: {what} did not finish cleanly: {e}")
        stop_vm_everywhere(name)
        windows.append(quiet_window(args, *quiet, "alone again"))
    except (ProtectionError, SystemExit, OSError, RuntimeError) as e:
        say(f"the neighbour run broke off: {e}")
        windows.append({"window": "broke off", "passed": False, "problem": str(e)})
    finally:
        for name, _, _ in COUNT_VMS:
            stop_vm_everywhere(name)
    alone = [w["pause_ms_p99"] for w in windows if w.get("window", "").startswith("alone")
             and w.get("passed")]
    beside = [w for w in windows if w.get("window") == "beside the busy VM" and w.get("passed")]
    ratio = (beside[0]["pause_ms_p99"] / statistics.mean(alone)
             if beside and alone and beside[0]["pause_ms_p99"] else None)
    lat_alone = [w["latency_ms"] for w in windows if w.get("window", "").startswith("alone")
                 and w.get("passed")]
    return {"windows": windows, "warmup_s": NEIGHBOUR_WARMUP_S,
            "busy": {"pgbench_clients": BUSY_CLIENTS,
                                         "rdb_dirty_dense_mb": BUSY_DIRTY_MB},
            "pause_p99_ratio_beside_over_alone": ratio,
            "latency_ratio_beside_over_alone": (beside[0]["latency_ms"] / statistics.mean(
                lat_alone) if beside and lat_alone else None),
            "passed": all(w.get("passed") for w in windows)
            and len(windows) == NEIGHBOUR_WINDOWS + bool(args.loop_profile)}


# ------------------------------------------------------------ the run

def run(args, out_dir):
    sizes, counts = csv_ints(args.sizes), csv_ints(args.counts)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in ("shared", "eager", "lazy")]
    if bad or any(n < 1 or n > len(COUNT_VMS) for n in counts):
        raise SystemExit(f"bench scale: modes are shared, eager, lazy (not {bad}); counts "
                         f"1..{len(COUNT_VMS)}")
    workdir = Path(failover.DRILLS_DIR) / time.strftime("scale-%Y%m%d-%H%M%S")
    workdir.mkdir(parents=True, exist_ok=True)
    stem = args.out or str(out_dir / "scale")
    ram_runs = []

    def keep_so_far(**more):
        """What ran so far, so that a run stopped part-way still leaves its record."""
        workload.save_json(stem + ".json", {**result_head("scale", None), "complete": False,
                                            "ram_runs": ram_runs, **more})
    for size in sizes:
        for mode in modes:
            ram_runs.append(ram_drill(args, size, mode, len(ram_runs) + 1))
            keep_so_far()
    windows = count_runs(args, counts, workdir) if counts else []
    keep_so_far(count_windows=windows)
    neighbour = None if args.no_neighbour else neighbour_runs(args, workdir)
    accel = next((r["accel"] for r in ram_runs if r.get("accel")), None)
    result = {**result_head("scale", accel),
              "load": {"pgbench_clients": PGBENCH_CLIENTS, "ledger_connections":
                       LEDGER_CONNECTIONS, "rdb_dirty": {"rate_mb": args.dirty_rate,
                                                         "mode": args.dirty_mode,
                                                         "buffer_mb": DIRTY_BUFFER_MB},
                       "interval_ms": INTERVAL_MS, "busy_interval_ms": BUSY_INTERVAL_MS},
              "sizes_mb": sizes, "modes": modes, "counts": counts,
              "host_memory_bytes": os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"),
              "ram_runs": ram_runs, "by_size": ram_summary(ram_runs, sizes, modes),
              "count_windows": windows, "neighbour": neighbour, "workdir": str(workdir),
              "complete": True,
              "passed": (all(r["passed"] for r in ram_runs) and all(w["passed"] for w in windows)
                         and (neighbour is None or neighbour["passed"]))}
    result["guest"]["memory_mib"] = sizes
    workload.save_json(stem + ".json", result)
    plot(result, stem + ".png")
    say(f"wrote {stem}.json and {stem}.png ({'passed' if result['passed'] else 'FAILED'})")
    return result


COLORS = {"eager": "#d62728", "lazy": "#1f77b4", "shared": "#2ca02c"}


def rss_ratio(m):
    """remusdbd's resident set over the guest RAM it protects (goal: at most 1.15)."""
    if m.get("daemon_rss_bytes") and m.get("protected_ram_bytes"):
        return m["daemon_rss_bytes"] / m["protected_ram_bytes"]
    return None


def legend(ax, **kw):
    """A legend only where something labelled was drawn (a part not run draws nothing)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kw)


def plot_neighbour(result, path):
    """A run of the neighbour windows alone: the quiet VM's pause p99 and
    its two parts per window, and what the primary's event loop did."""
    plt = pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(15, 6))
    nb = (result.get("neighbour") or {}).get("windows") or []
    xs = range(len(nb))
    labels = [textwrap.fill(w.get("window", "?") + ("" if w.get("passed") else " (FAILED)"), 18)
              for w in nb]
    def traced(w):
        return (w.get("qemu_phases") or {}).get("guest_pause_ms_p99")
    bars = [(lambda w: w.get("pause_ms_p99"), "pause p99 (our REPLY to our LOADED)", "#1f77b4"),
            (lambda w: w.get("guest_pause_ms_p99"), "REPLY to QEMU's RESUME, p99", "#17becf"),
            (traced, "guest stopped to running by QEMU's trace, p99", "#d62728"),
            (lambda w: w.get("stop_ms_p99"), "QEMU stopping, p99", "#ff7f0e"),
            (lambda w: w.get("bitmap_sync_ms_p99"), "bitmap sync, p99", "#2ca02c")]
    bars = [b for b in bars if any(b[0](w) for w in nb)]  # what this run measured
    width = 0.8 / len(bars)
    for i, (value, label, color) in enumerate(bars):
        off = (i - (len(bars) - 1) / 2) * width
        ax.bar([x + off for x in xs], [value(w) or 0 for w in nb], width=width, color=color,
               label=label)
    top = max([value(w) or 0 for value, _, _ in bars for w in nb] + [1])
    ax.set_ylim(0, top * 1.55)  # room for the legend above the bars
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_ylabel("ms")
    ax.set_title("the quiet VM's checkpoint pause, per 60 s window")
    legend(ax, fontsize="small")
    loops = [((w.get("loop") or {}).get("primary") or {}) for w in nb]
    ax2.bar([x - 0.2 for x in xs], [100 * (lp.get("busy_share") or 0) for lp in loops],
            width=0.4, color="#9467bd", label="busy share (%, left)")
    ax3 = ax2.twinx()
    ax3.bar([x + 0.2 for x in xs], [lp.get("turns_past_1ms") or 0 for lp in loops], width=0.4,
            color="#8c564b", label="turns past 1 ms (right)")
    ax2.set_xticks(list(xs), labels, fontsize=7)
    ax2.set_ylabel("% of the window")
    ax3.set_ylabel("turns")
    ax2.set_title("the primary's event loop")
    legend(ax2, loc="upper left", fontsize="small")
    legend(ax3, loc="upper right", fontsize="small")
    fig.suptitle(f"the noisy neighbour ({result['date']})"
                 + ("" if result["passed"] else " - SOME WINDOWS FAILED"))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot(result, path):
    if not result["sizes_mb"] and not result["count_windows"] and result.get("neighbour"):
        return plot_neighbour(result, path)
    plt = pyplot()
    fig, axes = plt.subplots(2, 4, figsize=(19, 8))
    sizes = result["sizes_mb"]
    ok = [r for r in result["ram_runs"] if r["passed"]]
    gib = [s / 1024 for s in sizes]

    def series(key, rows):
        by = {r["mem_mb"]: [] for r in rows}
        for r in rows:
            if r.get(key) is not None:
                by[r["mem_mb"]].append(r[key])
        xs = [s / 1024 for s in sizes if by.get(s)]
        return xs, [statistics.median(by[s]) for s in sizes if by.get(s)]

    ax = axes[0][0]
    for key, label in (("pause_ms_p50", "pause p50"), ("pause_ms_p99", "pause p99"),
                       ("bitmap_sync_ms_p99", "bitmap sync p99")):
        ax.plot(*series(key, ok), "o-", label=label)
    ax.set_xlabel("guest RAM (GiB)")
    ax.set_ylabel("ms")
    ax.set_title("checkpoint pause")
    legend(ax, fontsize="small")
    ax = axes[0][1]
    xs, ys = series("initial_sync_s", ok)
    ax.plot(xs, ys, "o-", color="#9467bd", label="initial sync (s)")
    ax.set_xlabel("guest RAM (GiB)")
    ax.set_ylabel("s")
    ax2 = ax.twinx()
    xs, ys = series("bytes_per_epoch_mean", ok)
    ax2.plot(xs, [y / 1024 for y in ys], "s--", color="#8c564b", label="KiB per epoch")
    ax2.set_ylabel("KiB per epoch")
    ax.set_title("initial sync (o) and bytes per epoch (s)")
    ax = axes[0][2]
    for mode in result["modes"]:
        rows = [r for r in ok if r["restore"] == mode]
        ax.plot(*series("takeover_ms", rows), "o-", color=COLORS[mode], label=f"takeover, {mode}")
        ax.plot(*series("downtime_ms", rows), "s--", color=COLORS[mode],
                label=f"client downtime, {mode}")
    ax.set_xlabel("guest RAM (GiB)")
    ax.set_ylabel("ms")
    ax.set_title("takeover after a power cut")
    legend(ax, fontsize="x-small")
    ax = axes[1][0]
    for mode in result["modes"]:
        rows = [r for r in ok if r["restore"] == mode]
        pts = [(r["mem_mb"] / 1024, rss_ratio(r["backup_memory"]))
               for r in rows if rss_ratio(r["backup_memory"])]
        peaks = [(r["mem_mb"] / 1024, r["backup_memory"]["host_pss_bytes_peak_takeover"]
                  / (r["mem_mb"] << 20))
                 for r in rows if r["backup_memory"]["host_pss_bytes_peak_takeover"]]
        if pts:
            ax.plot(*zip(*pts), "o", color=COLORS[mode],
                    label=f"remusdbd RSS / protected RAM, {mode}")
        if peaks:
            ax.plot(*zip(*peaks), "^", color=COLORS[mode],
                    label=f"host PSS peak in takeover / RAM, {mode}")
    ax.axhline(1.15, color="grey", lw=0.8, ls=":")
    ax.set_xticks(gib)
    ax.set_xlabel("guest RAM (GiB)")
    ax.set_ylabel("bytes per protected byte")
    ax.set_title("backup memory")
    legend(ax, fontsize="x-small")
    wins = [w for w in result["count_windows"] if w.get("per_vm")]
    ns = [w["vms"] for w in wins]
    ax = axes[1][1]
    for key, label, mark in (("epochs_per_s", "epochs/s per VM", "o"),):
        for w in wins:
            ax.plot([w["vms"]] * len(w["per_vm"]), [v[key] for v in w["per_vm"]], mark,
                    color="#1f77b4", label=label if w is wins[0] else None)
    ax3 = ax.twinx()
    for w in wins:
        ax3.plot([w["vms"] + 0.08] * len(w["per_vm"]), [v["pause_ms_p99"] for v in w["per_vm"]],
                 "s", color="#d62728", label="pause p99 (ms)" if w is wins[0] else None)
        gaps = [v["heartbeat_gap_ms_p99_primary"] for v in w["per_vm"]
                if v["heartbeat_gap_ms_p99_primary"] is not None]
        ax3.plot([w["vms"] + 0.16] * len(gaps), gaps, "^",
                 color="#2ca02c", label="heartbeat gap p99 (ms)" if w is wins[0] else None)
    ax.set_xticks(ns)
    ax.set_xlabel("VMs protected at once")
    ax.set_ylabel("epochs/s per VM")
    ax3.set_ylabel("ms")
    ax.set_title("per VM, against N (false failovers: "
                 f"{sum(w.get('false_failovers', 0) for w in wins)})")
    legend(ax, loc="upper left", fontsize="x-small")
    legend(ax3, loc="upper right", fontsize="x-small")
    ax = axes[1][2]
    for h, c in (("primary", "#ff7f0e"), ("backup", "#17becf")):
        ax.plot(ns, [w["cpu_cores_by_host"][h] for w in wins], "o-", color=c, label=h)
    ax.set_xticks(ns)
    ax.set_xlabel("VMs protected at once")
    ax.set_ylabel("CPU (cores)")
    ax.set_title("CPU of each host's processes")
    legend(ax, fontsize="small")
    ax = axes[0][3]
    nb = [w for w in ((result.get("neighbour") or {}).get("windows") or []) if w.get("passed")]
    if nb:
        xs = range(len(nb))
        ax.bar([x - 0.2 for x in xs], [w["pause_ms_p99"] for w in nb], width=0.4,
               color="#1f77b4", label="pause p99 (ms, left)")
        ax4 = ax.twinx()
        ax4.bar([x + 0.2 for x in xs], [w["latency_ms"] for w in nb], width=0.4,
                color="#ff7f0e", label="transaction latency, mean (ms, right)")
        ax.set_xticks(list(xs), [textwrap.fill(w["window"], 16) for w in nb], fontsize=7)
        ax.set_ylabel("pause p99 (ms)")
        ax4.set_ylabel("transaction latency (ms)")
        legend(ax, loc="upper left", fontsize="x-small")
        legend(ax4, loc="upper right", fontsize="x-small")
    ax.set_title("the quiet VM, alone and beside a busy one")
    axes[1][3].axis("off")
    load = result["load"]
    fig.suptitle(f"scale: pgbench {load['pgbench_clients']} clients + ledger + rdb-dirty "
                 f"{load['rdb_dirty']['mode']} {load['rdb_dirty']['rate_mb']:g} MiB/s per VM, "
                 f"{load['interval_ms']} ms epochs ({result['accel']})"
                 + ("" if result["passed"] else " - SOME RUNS FAILED"))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
