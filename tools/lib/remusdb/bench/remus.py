"""remusdb-bench remus: what Remus protection costs a database VM, the
"unoptimized Remus" numbers that the RemusDB optimizations are measured
against (thesis section 3.6).

One VM is booted once. pgbench runs against it unprotected, then protected
at each checkpoint interval in turn (protect, warm up, measure, unprotect),
then unprotected again, so that the unprotected runs bracket the protected
ones and drift in the machine's speed shows up as a difference between the
two unprotected runs rather than as a cost of protection. Each protected
window starts with `reset-stats`, so the checkpoint pause percentiles,
bytes and dirty pages per epoch that the primary's remusdbd reports cover
that window only, under that load.
"""
import statistics
import time
from functools import partial

from .. import output, paths, protection
from ..drill.lab import fresh_vm_for_protection, stop_vm_everywhere
from ..lab import vm, workload
from . import harness
from .harness import intervals, result_head
from .plot import pyplot

VM_NAME = "benchr"
say = partial(output.say, "bench remus")


def add_parser(sub):
    b = sub.add_parser("remus", help="pgbench unprotected vs. protected at each interval")
    b.add_argument("--intervals", type=intervals, default=[100, 50, 25], metavar="MS,MS,...",
                   help="checkpoint intervals to measure (default 100,50,25)")
    b.add_argument("--seconds", type=int, default=60, help="measured pgbench seconds per run")
    b.add_argument("--warmup", type=int, default=10, help="pgbench seconds before each run")
    b.add_argument("--clients", type=int, default=4)
    b.add_argument("--out", default=None, help="output stem (default docs/bench/remus)")
    return b


def measure_pgbench(args, label):
    workload.pgbench(vm.DEFAULT_IP, seconds=args.warmup, clients=args.clients)
    return run_pgbench(args, label)


def run_pgbench(args, label):
    r = workload.pgbench(vm.DEFAULT_IP, seconds=args.seconds, clients=args.clients)
    if r["exit_code"] != 0 or r["tps"] is None:
        raise SystemExit(f"pgbench failed ({label}):\n{r['output'][-2000:]}")
    say(f"{label:>14}: tps={r['tps']:.2f} latency={r['latency_ms']:.1f} ms")
    return {"tps": r["tps"], "latency_ms": r["latency_ms"],
            "transactions": r["transactions"], "progress_tps": r["progress_tps"]}


def protected_run(args, interval):
    started = time.monotonic()
    with harness.protected(VM_NAME, interval,
                           progress=lambda p: say(protection.describe_progress(p))):
        protect_s = time.monotonic() - started
        say(f"protected at {interval} ms in {protect_s:.1f} s")
        run, p = harness.measured_window(
            VM_NAME,
            lambda: workload.pgbench(vm.DEFAULT_IP, seconds=args.warmup, clients=args.clients),
            lambda: run_pgbench(args, f"protected {interval} ms"))
    if p.get("state") != "protected":
        raise SystemExit(f"protection at {interval} ms broke during the run: {p.get('error')}")
    epochs = p["epochs_since_reset"]
    run.update({
        "interval_ms": interval, "protect_s": round(protect_s, 1),
        "epochs": epochs,
        "epochs_per_s": epochs / args.seconds,
        "pause_ms_p50": p["pause_ms_p50"], "pause_ms_p99": p["pause_ms_p99"],
        "bytes_per_epoch_mean": p["bytes_per_epoch_mean"],
        "dirty_pages_per_epoch_mean": p["dirty_pages_per_epoch_mean"],
        "backpressure_events": p["backpressure_events"],
        "max_peer_silence_ms": p["max_peer_silence_ms"],
    })
    say(f"{interval} ms: {epochs} epochs, pause p50/p99 {p['pause_ms_p50']:.1f}/"
        f"{p['pause_ms_p99']:.1f} ms, {p['bytes_per_epoch_mean'] / 1024:.0f} KiB/epoch")
    return run


def run(args, out_dir):
    accel = fresh_vm_for_protection(VM_NAME)
    try:
        first = measure_pgbench(args, "unprotected")
        protected = [protected_run(args, ms) for ms in args.intervals]
        last = measure_pgbench(args, "unprotected")
    finally:
        stop_vm_everywhere(VM_NAME)
    unprotected_tps = statistics.mean([first["tps"], last["tps"]])
    for r in protected:
        r["tps_ratio_protected_over_unprotected"] = r["tps"] / unprotected_tps
    result = {
        **result_head("remus", accel),
        "pgbench": {"clients": args.clients, "seconds": args.seconds,
                    "warmup_seconds": args.warmup},
        "qemu": str(paths.qemu_binary().resolve()),
        "order": ["unprotected"] + [f"protected {ms} ms" for ms in args.intervals]
        + ["unprotected"],
        "unprotected": {"tps_mean": unprotected_tps, "runs": [first, last]},
        "protected": protected,
    }
    stem = args.out or str(out_dir / "remus")
    workload.save_json(stem + ".json", result)
    plot(result, stem + ".png")
    for r in protected:
        say(f"{r['interval_ms']:>3} ms: TPS ratio {r['tps_ratio_protected_over_unprotected']:.3f}")
    say(f"wrote {stem}.json and {stem}.png")
    return result


def plot(result, path):
    plt = pyplot()
    prot = result["protected"]
    labels = ["unprotected"] + [f"{r['interval_ms']} ms" for r in prot]
    tps = [result["unprotected"]["tps_mean"]] + [r["tps"] for r in prot]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(13, 3.8))
    ax1.bar(range(len(labels)), tps, color=["#888888"] + ["#1f77b4"] * len(prot))
    ax1.scatter([0, 0], [r["tps"] for r in result["unprotected"]["runs"]], color="black",
                s=12, zorder=3)
    for i, r in enumerate(prot, start=1):
        ax1.annotate(f"{r['tps_ratio_protected_over_unprotected']:.2f}x", (i, r["tps"]),
                     ha="center", va="bottom", fontsize=8)
    ax1.set_xticks(range(len(labels)), labels, fontsize=8)
    ax1.set_ylabel("pgbench TPS")
    xs = range(len(prot))
    ticks = [f"{r['interval_ms']} ms" for r in prot]
    ax2.bar([x - 0.2 for x in xs], [r["pause_ms_p50"] for r in prot], width=0.4, label="p50")
    ax2.bar([x + 0.2 for x in xs], [r["pause_ms_p99"] for r in prot], width=0.4, label="p99")
    ax2.set_xticks(list(xs), ticks, fontsize=8)
    ax2.set_ylabel("checkpoint pause (ms)")
    ax2.legend(fontsize=8)
    ax3.bar(list(xs), [r["bytes_per_epoch_mean"] / 1024 for r in prot], color="#2ca02c")
    ax3.set_xticks(list(xs), ticks, fontsize=8)
    ax3.set_ylabel("KiB per epoch (mean)")
    fig.suptitle(f"Remus protection of a PostgreSQL VM, pgbench {result['pgbench']['clients']} "
                 f"clients x {result['pgbench']['seconds']} s per run ({result['accel']})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
