"""remusdb-bench cp: what commit protection buys pgbench (issue 10; the
analogue of the thesis's Figure 3.14 and 3.8).

Under plain Remus every reply waits for the checkpoint that follows it,
so a TPC-B transaction's seven round trips each pay about half an epoch.
With commit protection (patched PostgreSQL, relay in CP mode) only the
COMMIT's acknowledgement waits. One VM is booted once; pgbench runs
unprotected, then at each interval protected as plain Remus and with
--commit-protection (protect, warm up, measure, unprotect), then
unprotected again, so that the two unprotected runs bracket the rest and
show the machine's drift. Per-transaction latencies come from pgbench's
own transaction log (-l): p50 and p99 of each window.
"""
import glob
import shutil
import statistics
import tempfile
from pathlib import Path
from functools import partial

from .. import output, paths, protection
from ..drill.lab import fresh_vm_for_protection, stop_vm_everywhere
from ..lab import vm, workload
from . import harness
from .harness import intervals, result_head
from .plot import pyplot

VM_NAME = "benchcp"
say = partial(output.say, "bench cp")


def add_parser(sub):
    b = sub.add_parser("cp", help="pgbench TPS and latency: Remus vs. commit protection")
    b.add_argument("--intervals", type=intervals, default=[25, 50, 100, 250],
                   metavar="MS,MS,...", help="checkpoint intervals (default 25,50,100,250)")
    b.add_argument("--seconds", type=int, default=20, help="measured pgbench seconds per run")
    b.add_argument("--warmup", type=int, default=5, help="pgbench seconds before each run")
    b.add_argument("--clients", type=int, default=8)
    b.add_argument("--out", default=None, help="output stem (default docs/bench/cp)")
    return b


def percentile(values, q):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100.0 * (len(s) - 1))))]


def pgbench_window(args, label):
    """One measured window with per-transaction latencies (ms)."""
    logdir = Path(tempfile.mkdtemp(prefix="rdb-bench-cp-"))
    try:
        r = workload.pgbench(vm.DEFAULT_IP, seconds=args.seconds, clients=args.clients,
                             extra=("-l", "--log-prefix", str(logdir / "tx")))
        if r["exit_code"] != 0 or r["tps"] is None:
            raise SystemExit(f"pgbench failed ({label}):\n{r['output'][-2000:]}")
        latencies = []
        for f in glob.glob(str(logdir / "tx*")):
            for line in Path(f).read_text(errors="replace").splitlines():
                fields = line.split()
                # client tx time_us script epoch_s epoch_us: time is the transaction's latency
                if len(fields) >= 6 and fields[2].isdigit():
                    latencies.append(int(fields[2]) / 1000.0)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    run = {"tps": r["tps"], "latency_ms_mean": r["latency_ms"],
           "latency_ms_p50": percentile(latencies, 50),
           "latency_ms_p99": percentile(latencies, 99),
           "transactions": r["transactions"], "progress_tps": r["progress_tps"]}
    say(f"{label:>22}: tps={run['tps']:.2f} latency p50/p99 "
        f"{run['latency_ms_p50']:.1f}/{run['latency_ms_p99']:.1f} ms")
    return run


def unprotected_run(args, label):
    workload.pgbench(vm.DEFAULT_IP, seconds=args.warmup, clients=args.clients)
    return pgbench_window(args, label)


def protected_run(args, interval, cp):
    label = f"{'CP' if cp else 'Remus'} {interval} ms"

    def measure():
        # the relay's counters at the window's start: the run reports their growth
        before = protection.primary_protection("primary", VM_NAME).get("commit_protection")
        return before, pgbench_window(args, label)

    with harness.protected(VM_NAME, interval,
                           progress=lambda p: say(protection.describe_progress(p)),
                           options={"commit_protection": True} if cp else None):
        (before, run), p = harness.measured_window(
            VM_NAME,
            lambda: workload.pgbench(vm.DEFAULT_IP, seconds=args.warmup, clients=args.clients),
            measure)
    if p.get("state") != "protected":
        raise SystemExit(f"protection ({label}) broke during the run: {p.get('error')}")
    run.update({"interval_ms": interval, "commit_protection": cp,
                "pause_ms_p50": p["pause_ms_p50"], "pause_ms_p99": p["pause_ms_p99"],
                "epochs": p["epochs_since_reset"]})
    if cp:
        after = p["commit_protection"]
        run["relay"] = {k: after[k] - before[k] for k in
                        ("marked_held", "held_behind_their_flow", "released_at_once",
                         "ahead_notices")}
    return run


def run(args, out_dir):
    accel = fresh_vm_for_protection(VM_NAME)
    runs = []
    try:
        first = unprotected_run(args, "unprotected")
        for ms in args.intervals:
            # Side by side at each interval, in alternating order so that
            # neither configuration always runs first.
            order = (False, True) if len(runs) % 4 == 0 else (True, False)
            for cp in order:
                runs.append(protected_run(args, ms, cp))
        last = unprotected_run(args, "unprotected")
    finally:
        stop_vm_everywhere(VM_NAME)
    base_tps = statistics.mean([first["tps"], last["tps"]])
    for r in runs:
        r["tps_ratio"] = r["tps"] / base_tps
    result = {
        **result_head("cp", accel),
        "pgbench": {"clients": args.clients, "seconds": args.seconds,
                    "warmup_seconds": args.warmup},
        "qemu": str(paths.qemu_binary().resolve()),
        "unprotected": {"tps_mean": base_tps, "runs": [first, last]},
        "protected": runs,
    }
    stem = args.out or str(out_dir / "cp")
    workload.save_json(stem + ".json", result)
    plot(result, stem + ".png")
    for ms in args.intervals:
        rr = {r["commit_protection"]: r for r in runs if r["interval_ms"] == ms}
        say(f"{ms:>3} ms: TPS ratio Remus {rr[False]['tps_ratio']:.3f}, CP "
            f"{rr[True]['tps_ratio']:.3f}; p50 {rr[False]['latency_ms_p50']:.1f} -> "
            f"{rr[True]['latency_ms_p50']:.1f} ms, p99 {rr[False]['latency_ms_p99']:.1f} -> "
            f"{rr[True]['latency_ms_p99']:.1f} ms")
    say(f"wrote {stem}.json and {stem}.png")
    return result


def plot(result, path):
    plt = pyplot()
    runs = result["protected"]
    ms = sorted({r["interval_ms"] for r in runs})
    pick = {(r["interval_ms"], r["commit_protection"]): r for r in runs}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
    for cp, name, color in ((False, "Remus", "#d62728"), (True, "commit protection", "#1f77b4")):
        ax1.plot(ms, [pick[(m, cp)]["tps_ratio"] for m in ms], "o-", color=color, label=name)
        ax2.plot(ms, [pick[(m, cp)]["latency_ms_p50"] for m in ms], "o-", color=color,
                 label=f"{name} p50")
        ax2.plot(ms, [pick[(m, cp)]["latency_ms_p99"] for m in ms], "s--", color=color,
                 label=f"{name} p99")
    u = result["unprotected"]["runs"]
    ax1.axhline(1.0, color="#888888", lw=0.8)
    ax1.set_xlabel("checkpoint interval (ms)")
    ax1.set_ylabel("TPS / unprotected")
    ax1.set_ylim(0, max(1.1, max(r["tps_ratio"] for r in runs) * 1.1))
    ax1.legend(fontsize=8)
    ax2.axhline(statistics.mean(x["latency_ms_p50"] for x in u), color="#888888", lw=0.8,
                label="unprotected p50")
    ax2.set_xlabel("checkpoint interval (ms)")
    ax2.set_ylabel("pgbench transaction latency (ms)")
    ax2.set_yscale("log")
    ax2.legend(fontsize=7)
    fig.suptitle(f"pgbench TPC-B, {result['pgbench']['clients']} clients x "
                 f"{result['pgbench']['seconds']} s per run, Remus vs. commit protection "
                 f"({result['accel']}, unprotected {result['unprotected']['tps_mean']:.1f} tps)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
