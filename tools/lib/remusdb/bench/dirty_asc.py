"""remusdb-bench dirty-asc: the synthetic guest writer under plain Remus
and under ASC+RT (issue 9, "Also": pause p99, the highest sustained dirty
rate before backpressure, and bytes per epoch, with and without ASC).

One VM, booted once; at one interval (`--interval`, 50 ms) it is
protected with the optimizations on (the default), every rdb-dirty run
of the plan is measured, then protected again with `--no-compress
--no-read-tracking` for the same plan. A run is dirty.py's: rdb-dirty
started in the guest, settle, reset-stats, one quiet window, the
primary's status. rdb-dirty's sparse mode changes one 8-byte word per
page (what ASC is for); its dense mode rewrites each page with new
pseudo-random bytes, which no codec compresses (ASC's worst case: it must
cost no more than Remus).

The highest sustained rate per configuration uses dirty.py's rule: no
backpressure and at least 80% of the idle run's epochs/s.
"""
import time

from .. import guest_agent, paths, protection
from ..lab import workload
from .dirty import VM_NAME, fresh_vm_with_rdb_dirty, protected, rates, say, synthetic_run
from ..drill.lab import stop_vm_everywhere
from .harness import result_head
from .plot import pyplot

CONFIGS = {"asc+rt": {}, "remus": {"compress": False, "read_tracking": False}}


def add_parser(sub):
    b = sub.add_parser("dirty-asc", help="rdb-dirty under Remus and under ASC+RT")
    b.add_argument("--interval", type=int, default=50)
    b.add_argument("--sparse-rates", type=rates, default=[64, 256, 1024], metavar="MIB,...")
    b.add_argument("--dense-rates", type=rates, default=[64, 256, 1024, 2048], metavar="MIB,...")
    b.add_argument("--buffer-mb", type=int, default=128)
    b.add_argument("--seconds", type=float, default=10, help="measured window per run")
    b.add_argument("--settle", type=float, default=4)
    b.add_argument("--out", default=None, help="output stem (default docs/bench/dirty-asc)")


def config_runs(args, config):
    plan = ([("idle", 0)] + [("sparse", r) for r in args.sparse_rates]
            + [("dense", r) for r in args.dense_rates])
    runs = []
    with protected(args.interval, options=CONFIGS[config]):
        for mode, rate in plan:
            r = synthetic_run(args, args.interval, mode, rate)
            p = protection.primary_protection("primary", VM_NAME) or {}
            pl = p.get("pipeline") or {}
            r.update({"config": config, "interval_ms": args.interval,
                      "raw_dirty_bytes_per_epoch": pl.get("raw_dirty_bytes_per_epoch_mean"),
                      "page_bytes_sent_per_epoch": pl.get("page_bytes_sent_per_epoch_mean"),
                      "device_bytes_sent_per_epoch": pl.get("device_bytes_sent_per_epoch_mean")})
            say(f"{config:>7} {r['workload']:>22}: {r['dirty_pages_per_epoch_mean']:.0f} pages/epoch, "
                f"{r['bytes_per_epoch_mean'] / 2**20:.2f} MiB/epoch, pause p99 "
                f"{r['pause_ms_p99']:.1f} ms, {r['epochs_per_s']:.1f} epochs/s, "
                f"backpressure {r['backpressure_events']}")
            runs.append(r)
    return runs


def highest_sustained(runs, config, mode):
    idle = [r for r in runs if r["config"] == config and r["kind"] == "idle"]
    floor = idle[0]["epochs_per_s"] if idle else 0
    ok = sorted((r for r in runs if r["config"] == config and r["kind"] == mode
                 and r["backpressure_events"] == 0 and r["epochs_per_s"] >= 0.8 * floor),
                key=lambda r: r["rate_mb"])
    return ok[-1]["rate_mb"] if ok else None


def compare(runs):
    rows = []
    for r in runs:
        if r["config"] != "asc+rt" or r["kind"] == "idle":
            continue
        base = [x for x in runs if x["config"] == "remus" and x["kind"] == r["kind"]
                and x["rate_mb"] == r["rate_mb"]]
        if not base:
            continue
        b = base[0]
        rows.append({
            "workload": r["workload"],
            "bytes_per_epoch_asc": r["bytes_per_epoch_mean"],
            "bytes_per_epoch_remus": b["bytes_per_epoch_mean"],
            "bytes_ratio_asc_to_remus": (r["bytes_per_epoch_mean"] / b["bytes_per_epoch_mean"]
                                         if b["bytes_per_epoch_mean"] else None),
            "pause_ms_p99_asc": r["pause_ms_p99"], "pause_ms_p99_remus": b["pause_ms_p99"],
            "epochs_per_s_asc": r["epochs_per_s"], "epochs_per_s_remus": b["epochs_per_s"],
        })
    return rows


def run(args, out_dir):
    accel = fresh_vm_with_rdb_dirty()
    runs, failures = [], []
    try:
        for config in CONFIGS:
            try:
                runs += config_runs(args, config)
            except (protection.ProtectionError, guest_agent.GuestAgentError, SystemExit) as e:
                say(f"{config} failed: {e}")
                failures.append({"config": config, "error": str(e)})
    finally:
        stop_vm_everywhere(VM_NAME)
    result = {
        **result_head("dirty-asc", accel),
        "settings": {k: getattr(args, k) for k in ("interval", "sparse_rates", "dense_rates",
                                                   "buffer_mb", "seconds", "settle")},
        "configs": CONFIGS,
        "qemu": str(paths.qemu_binary().resolve()),
        "runs": runs,
        "failed_configs": failures,
        "comparison": compare(runs),
        "highest_sustained_rate_mb": {c: {m: highest_sustained(runs, c, m)
                                          for m in ("sparse", "dense")} for c in CONFIGS},
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    stem = args.out or str(out_dir / "dirty-asc")
    workload.save_json(stem + ".json", result)
    plot(result, stem + ".png")
    say(f"highest sustained rates: {result['highest_sustained_rate_mb']}")
    say(f"wrote {stem}.json and {stem}.png")
    return result


def plot(result, path):
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(17, 5))
    panels = [("bytes_per_epoch_mean", "MiB sent per epoch", 1 / 2**20),
              ("pause_ms_p99", "pause p99 (ms)", 1), ("epochs_per_s", "epochs per second", 1)]
    for ax, (key, label, scale) in zip(axes, panels):
        for config, style in (("remus", "--"), ("asc+rt", "-")):
            for mode, marker in (("sparse", "o"), ("dense", "s")):
                pts = sorted((r["rate_mb"], r[key]) for r in result["runs"]
                             if r["config"] == config and r["kind"] == mode)
                if pts:
                    ax.plot([x for x, _ in pts], [y * scale for _, y in pts], linestyle=style,
                            marker=marker, label=f"{config} {mode}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("rdb-dirty rate asked (MiB/s of guest time)")
        ax.set_ylabel(label)
        if key == "bytes_per_epoch_mean":
            ax.set_yscale("log")
        ax.legend(fontsize=8)
    fig.suptitle(f"rdb-dirty at {result['settings']['interval']} ms: plain Remus (dashed) vs "
                 f"ASC+RT (solid), {result['accel']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
