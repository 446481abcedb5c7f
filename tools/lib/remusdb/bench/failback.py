"""remusdb-bench failback: what a changed-block resync saves over a full
copy when a VM is protected back to its repaired old primary, in one run.

One VM is booted fresh on the primary and protected to the backup; pgbench
dirties its disk for a while; the primary loses power (drill/inject.py: no
FIN or RST, detection by heartbeats) and the backup takes the VM over;
pgbench runs again on the backup; the primary is repaired (network back,
remusdbd restarted, the VM's stopped definition and disk file still
there). Then, against that same VM and the same old primary:

  resync  `protect --host backup --backup primary`: only the 1 MiB extents
          that may differ go (the daemon's plan: disk_copy.mode "resync");
  full    unprotect, and protect again to the same host with full_copy:
          every byte of the disk goes (disk_copy.mode "full").

Each records the daemon's disk_copy (bytes_sent, extents, copy_seconds:
replication start to PROTECTED) and the wall time of the protect call, and
each ends with failback.disk_compare (the disk and its replica hashed per
extent at a held checkpoint): a copy that is fast but wrong is not a
result. A run that breaks off is recorded as failed with its reason and
whatever it measured, never dropped.
"""
import statistics
import sys
from functools import partial

from .. import failback, output, protection
from ..lab import workload
from ..drill.lab import forget_ownership, fresh_vm_for_protection, stop_vm_everywhere
from ..drill.inject import remove_leftover_cut
from ..lab.vm import DEFAULT_IP
from .harness import result_head
from .plot import pyplot

VM_NAME = "benchfb"
say = partial(output.say, "bench failback")


def add_parser(sub):
    b = sub.add_parser("failback", help="failback resync against a full copy, side by side")
    b.add_argument("--rounds", type=int, default=1,
                   help="whole runs (boot, failover, resync, full copy); default 1")
    b.add_argument("--load-seconds", type=int, default=30,
                   help="pgbench seconds before the power cut and again on the backup")
    b.add_argument("--clients", type=int, default=4)
    b.add_argument("--interval", type=int, default=failback.INTERVAL_MS, metavar="MS")
    b.add_argument("--keep-replica-files", action="store_true",
                   help="do not remove the hosts' replica files of the VM left from an "
                        "earlier run before each round (by default each round starts as on "
                        "hosts that never held a replica of it)")
    b.add_argument("--out", default=None, help="output stem (default docs/bench/failback)")
    return b


def load(args, where):
    r = workload.pgbench(DEFAULT_IP, seconds=args.load_seconds, clients=args.clients)
    if r["exit_code"] != 0 or r["tps"] is None:
        raise failback.FailbackError(f"pgbench failed on {where}:\n{r['output'][-1500:]}")
    say(f"pgbench on {where}: {r['tps']:.1f} tps, {r['transactions']:.0f} transactions")
    return {"tps": r["tps"], "transactions": r["transactions"]}


def copy_run(args, label, options=None):
    """Protects the VM on the backup host back to the primary host."""
    wall, p = failback.protect_back(VM_NAME, "backup", options=options,
                                    interval_ms=args.interval)
    replica = protection.replica("primary", VM_NAME) or {}
    compare = failback.disk_compare(VM_NAME, "backup")
    copy = p.get("disk_copy") or {}
    out = {"label": label, "options": options or {}, "protect_wall_s": round(wall, 2),
           "disk_copy": copy, "disk_base": replica.get("disk_base"),
           "bytes_sent": copy.get("bytes_sent"), "extents": copy.get("extents"),
           "copy_seconds": copy.get("copy_seconds"), "mode": copy.get("mode"),
           "disk_done_s": p.get("disk_done_s"),
           "reason": copy.get("reason"),
           "disk_compare": {k: compare[k] for k in ("equal", "epoch", "seconds",
                                                   "primary_disk", "replica_disk")}
           | {"differing_extents": compare["differing_extents"][:50]}}
    say(f"{label}: mode {out['mode']} ({out['reason']}), {out['bytes_sent']} bytes in "
        f"{out['extents']} extents, disk copied after {out['disk_done_s']} s, protected "
        f"after {out['copy_seconds']} s, protect call {wall:.1f} s, "
        f"disks {'equal' if compare['equal'] else 'DIFFER'}")
    return out


def one_round(args, index):
    run = {"round": index, "passed": False, "failed_reason": None, "steps": []}
    injection = None

    def step(what):
        run["steps"].append(what)
        say(f"round {index}: {what}")
    try:
        for host in ("primary", "backup"):
            remove_leftover_cut(host=host)
        if not args.keep_replica_files:
            stop_vm_everywhere(VM_NAME)
            failback.forget_replica_files(VM_NAME)  # as on hosts that never held one
        step("boot")
        run["accel"] = fresh_vm_for_protection(VM_NAME)
        step("protect primary -> backup (initial copy)")
        wall, p = failback.protect_back(VM_NAME, "primary", interval_ms=args.interval)
        run["initial"] = {"protect_wall_s": round(wall, 2), "disk_copy": p.get("disk_copy")}
        step("load on primary")
        run["load_primary"] = load(args, "primary")
        step("power cut of primary")
        injection, at, replica = failback.power_cut(VM_NAME, "primary")
        run["takeover"] = (replica.get("failover") or {})
        step("load on backup")
        run["load_backup"] = load(args, "backup")
        step("repair primary")
        run["power_cut"] = failback.repair(injection)
        injection = None
        run["disk_size"] = failback.full_copy_bytes(VM_NAME, "backup")
        step("failback: resync")
        run["resync"] = copy_run(args, "resync")
        step("unprotect")
        protection.unprotect(VM_NAME, host="backup")
        step("protect again with full_copy")
        run["full"] = copy_run(args, "full", options={"full_copy": True})
        r, f = run["resync"], run["full"]
        problems = []
        if r["mode"] != "resync":
            problems.append(f"the failback was not a resync ({r['mode']}: {r['reason']})")
        if f["mode"] != "full":
            problems.append(f"full_copy gave mode {f['mode']}")
        for x in (r, f):
            if not x["disk_compare"]["equal"]:
                problems.append(f"{x['label']}: the disk and its replica differ")
        if r["bytes_sent"] and f["bytes_sent"]:
            run["bytes_ratio_resync_to_full"] = r["bytes_sent"] / f["bytes_sent"]
        if r["copy_seconds"] and f["copy_seconds"]:
            run["seconds_ratio_resync_to_full"] = r["copy_seconds"] / f["copy_seconds"]
        if r["disk_done_s"] and f["disk_done_s"]:
            run["disk_seconds_ratio_resync_to_full"] = r["disk_done_s"] / f["disk_done_s"]
        run["passed"] = not problems
        run["problems"] = problems
    except (failback.FailbackError, protection.ProtectionError, SystemExit, OSError,
            RuntimeError, KeyError, ValueError) as e:
        run["failed_reason"] = f"{type(e).__name__} during {run['steps'][-1:]}: {e}"
        say(f"round {index} broke off: {run['failed_reason']}")
    finally:
        if injection is not None:
            try:
                injection.evidence()
            finally:
                injection.undo()
        stop_vm_everywhere(VM_NAME)
        forget_ownership(VM_NAME)
    return run


def summary(runs, key):
    vals = [r[key] for r in runs if r.get("passed") and r.get(key) is not None]
    return statistics.median(vals) if vals else None


def run(args, out_dir):
    runs = [one_round(args, i + 1) for i in range(args.rounds)]
    accel = next((r.get("accel") for r in runs if r.get("accel")), None)
    result = {**result_head("failback", accel),
              "interval_ms": args.interval, "load_seconds": args.load_seconds,
              "replica_files_kept": args.keep_replica_files,
              "clients": args.clients, "runs": runs,
              "passed": sum(bool(r["passed"]) for r in runs), "failed": sum(
                  not r["passed"] for r in runs),
              "bytes_ratio_resync_to_full_median": summary(runs, "bytes_ratio_resync_to_full"),
              "seconds_ratio_resync_to_full_median": summary(runs,
                                                             "seconds_ratio_resync_to_full"),
              "disk_seconds_ratio_resync_to_full_median": summary(
                  runs, "disk_seconds_ratio_resync_to_full")}
    stem = args.out or str(out_dir / "failback")
    workload.save_json(stem + ".json", result)
    plot(result, stem + ".png")
    say(f"{result['passed']} passed, {result['failed']} failed; bytes ratio "
        f"{result['bytes_ratio_resync_to_full_median']}, seconds ratio "
        f"{result['seconds_ratio_resync_to_full_median']}; wrote {stem}.json and {stem}.png")
    if result["failed"]:
        sys.exit(1)
    return result


def plot(result, path):
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.4))
    panels = (("bytes_sent", "disk bytes sent (MiB)", 1 / (1 << 20), "bytes_ratio_resync_to_full"),
              ("disk_done_s", "protect call to disk copied (s)", 1,
               "disk_seconds_ratio_resync_to_full"),
              ("copy_seconds", "replication start to PROTECTED (s)\n(disk and memory)", 1,
               "seconds_ratio_resync_to_full"))
    colors = {"resync": "#2ca02c", "full": "#d62728"}
    for ax, (key, label, scale, ratio_key) in zip(axes, panels):
        for i, run in enumerate(result["runs"]):
            for j, kind in enumerate(("resync", "full")):
                x = i * 3 + j
                value = (run.get(kind) or {}).get(key)
                if value is None or not run.get("passed"):
                    if j == 0:
                        why = (run.get("failed_reason") or "; ".join(run.get("problems") or [])
                               or "n/a")
                        ax.annotate(("FAILED: " if not run.get("passed") else "") + why[:60],
                                    (x + 0.5, 0), ha="center", va="bottom", fontsize=7,
                                    rotation=90)
                    continue
                ax.bar(x, value * scale, color=colors[kind],
                       label=kind if i == 0 else None, width=0.8)
                ax.annotate(f"{value * scale:.{1 if value * scale >= 10 else 2}f}",
                            (x, value * scale), ha="center",
                            va="bottom", fontsize=8)
            ratio = run.get(ratio_key)
            if ratio is not None:
                ax.annotate(f"ratio {ratio:.3f}", (i * 3 + 0.5, 0), xytext=(0, -28),
                            textcoords="offset points", ha="center", fontsize=8)
        ax.set_xticks([i * 3 + 0.5 for i in range(len(result["runs"]))],
                      [f"run {r['round']}" for r in result["runs"]])
        ax.set_ylabel(label)
        if ax.get_legend_handles_labels()[0]:
            ax.set_ylim(top=ax.get_ylim()[1] * 1.2)  # room for the legend above the bars
            ax.legend(fontsize=8, loc="upper left", ncol=2)
    fig.suptitle(f"failback to the repaired old primary: changed-block resync vs full copy "
                 f"({result['accel']}, {result['guest']['memory_mib']} MiB guest, "
                 f"{result['interval_ms']} ms epochs); {result['passed']} passed, "
                 f"{result['failed']} failed", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
