"""remusdb-bench baseline: pgbench through remusdbd (NBD disk + network
relay) against the same VM wired with a plain tap and a plain disk file,
alternating the wirings (ABAB...) so that drift in the machine's speed
hits both alike (baseline.json, baseline.png)."""
import statistics
import sys
import time

from .. import paths
from ..lab import netns, vm, workload
from .plot import pyplot

# name -> (disk, net); the mixed ones (--decompose) split the cost between
# the NBD disk path and the network relay.
WIRINGS = {"plain": ("file", "tap"), "remusdbd": ("nbd", "relay"),
           "nbd+tap": ("nbd", "tap"), "file+relay": ("file", "relay")}


def add_parser(sub):
    b = sub.add_parser("baseline")
    b.add_argument("--seconds", type=int, default=60)
    b.add_argument("--warmup", type=int, default=10)
    b.add_argument("--clients", type=int, default=4)
    b.add_argument("--rounds", type=int, default=2)
    b.add_argument("--decompose", action="store_true",
                   help="also run the mixed wirings (NBD disk + plain tap, file + relay)")


def run(args, out_dir):
    netns.up()
    name = "bench"
    wirings = dict(WIRINGS) if args.decompose else {k: WIRINGS[k] for k in ("plain", "remusdbd")}
    samples = {w: [] for w in wirings}
    order = list(wirings) * args.rounds
    fresh = True
    for wiring in order:
        disk_via, net_via = wirings[wiring]
        vm.start(name, "primary", disk_via=disk_via, net_via=net_via, fresh=fresh,
                 wait_timeout=400)
        fresh = False  # the same VM disk for every round
        accel = vm.status(name, "primary")["accel"]
        try:
            workload.pgbench(vm.DEFAULT_IP, seconds=args.warmup, clients=args.clients)
            r = workload.pgbench(vm.DEFAULT_IP, seconds=args.seconds, clients=args.clients)
        finally:
            vm.stop(name, "primary")
        if r["exit_code"] != 0 or r["tps"] is None:
            print(r["output"], file=sys.stderr)
            sys.exit(f"pgbench failed on the {wiring} wiring")
        print(f"{wiring:9} tps={r['tps']:.2f} latency={r['latency_ms']:.1f} ms", flush=True)
        samples[wiring].append({"tps": r["tps"], "latency_ms": r["latency_ms"],
                                "transactions": r["transactions"],
                                "progress_tps": r["progress_tps"]})
    summary = {}
    for wiring, runs in samples.items():
        summary[wiring] = {
            "tps_mean": statistics.mean(x["tps"] for x in runs),
            "latency_ms_mean": statistics.mean(x["latency_ms"] for x in runs),
            "runs": runs,
        }
    ratio = summary["remusdbd"]["tps_mean"] / summary["plain"]["tps_mean"]
    result = {
        "benchmark": "baseline",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "accel": accel,
        "guest": {"vcpus": 1, "memory_mib": 1024, "pgbench_scale": 5},
        "pgbench": {"clients": args.clients, "seconds": args.seconds,
                    "warmup_seconds": args.warmup, "rounds": args.rounds},
        "qemu": str(paths.qemu_binary().resolve()),
        "wirings": {w: {"disk": WIRINGS[w][0], "net": WIRINGS[w][1]} for w in wirings},
        **summary,
        "tps_ratio_remusdbd_over_plain": ratio,
        "tps_ratio_over_plain": {w: summary[w]["tps_mean"] / summary["plain"]["tps_mean"]
                                 for w in wirings},
        "tps_cost_percent": (1 - ratio) * 100,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    workload.save_json(out_dir / "baseline.json", result)
    plot(result, out_dir / "baseline.png")
    print(f"remusdbd/plain TPS ratio {ratio:.3f} (cost {(1 - ratio) * 100:.1f}%); "
          f"wrote {out_dir / 'baseline.json'} and baseline.png")


def plot(result, path):
    plt = pyplot()
    wirings = list(result["wirings"])
    labels = {"plain": "plain\ntap + file", "remusdbd": "remusdbd\nrelay + NBD",
              "nbd+tap": "tap +\nremusdbd NBD", "file+relay": "remusdbd relay\n+ file"}
    colors = {"plain": "#888888", "remusdbd": "#1f77b4", "nbd+tap": "#9ecae1",
              "file+relay": "#c6dbef"}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(4 + 2 * len(wirings), 3.8))
    for ax, key, label in ((ax1, "tps", "TPS"), (ax2, "latency_ms", "latency (ms)")):
        for i, w in enumerate(wirings):
            values = [run[key] for run in result[w]["runs"]]
            ax.bar(i, statistics.mean(values), color=colors[w], width=0.6)
            ax.scatter([i] * len(values), values, color="black", zorder=3, s=12)
        ax.set_xticks(range(len(wirings)), [labels[w] for w in wirings], fontsize=8)
        ax.set_ylabel(label)
    fig.suptitle(f"pgbench, {result['pgbench']['clients']} clients, "
                 f"{result['pgbench']['seconds']} s x {result['pgbench']['rounds']} rounds "
                 f"({result['accel']}); ratio {result['tps_ratio_remusdbd_over_plain']:.3f}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
