"""remusdb-bench dirty: what a checkpoint carries, against what the guest
wrote (issue 9, "Also").

One VM is booted once and protected in turn at each interval (protect,
wait until protected, then every workload under that one protection, then
unprotect: protect() copies all of RAM and the disk each time). Each
workload runs in the guest, started through the guest agent (no network
change): rdb-dirty (tools/guest/src/rdb-dirty.c) idle (rate 0, the same
process alive), sparse and dense at a few rates, and pgbench from the
client host for comparison. A run is: start the workload, let it settle,
`reset-stats`, wait one window without touching the guest, read the
primary's status. The guest agent is only asked again after the window.

Per run: dirty pages per epoch (mean, p50, p99), the daemon's dirty page
census (which RAM block the pages came from, how many distinct pages, how
many were dirty in nearly every epoch), pause p50/p99, bytes per epoch,
backpressure events, epochs/s, and for rdb-dirty the pages it should add
per epoch: rate x period / 4 KiB, capped by its buffer. At the one
interval `--sweep-interval` a sweep of dense rates looks for the highest
rate the stream sustains.
"""
import argparse
import json
import time
from contextlib import closing, contextmanager
from functools import partial

from .. import guest_agent, output, paths, protection
from ..lab import netns, vm, workload
from ..drill.lab import fresh_vm_for_protection, stop_vm_everywhere
from . import harness
from .harness import intervals, result_head
from .plot import pyplot

VM_NAME = "benchd"
PAGE = 4096
RDB_DIRTY = "/usr/local/bin/rdb-dirty"
say = partial(output.say, "bench dirty")


def rates(text):
    values = [float(x) for x in text.split(",") if x.strip()]
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"rates must be positive MiB/s: {text!r}")
    return values


def add_parser(sub):
    b = sub.add_parser("dirty", help="dirty pages per epoch: synthetic guest writer, "
                                     "idle and pgbench at each interval")
    b.add_argument("--intervals", type=intervals, default=[25, 50, 100, 250],
                   metavar="MS,MS,...", help="checkpoint intervals (default 25,50,100,250)")
    b.add_argument("--rates", type=rates, default=[4, 16, 64], metavar="MIB,...",
                   help="rdb-dirty rates in MiB/s, sparse and dense (default 4,16,64)")
    b.add_argument("--sweep-interval", type=int, default=50,
                   help="interval of the dense rate sweep (default 50)")
    b.add_argument("--sweep-rates", type=rates, default=[256, 512, 1024, 2048],
                   metavar="MIB,...",
                   help="extra dense rates at the sweep interval (default 256,512,1024,2048)")
    b.add_argument("--buffer-mb", type=int, default=128,
                   help="rdb-dirty buffer (default 128 MiB: more than 64 MiB/s x 250 ms "
                        "and 2048 MiB/s x 50 ms)")
    b.add_argument("--seconds", type=float, default=12, help="measured window per run")
    b.add_argument("--settle", type=float, default=5,
                   help="seconds a workload runs before its window (rdb-dirty touches "
                        "its whole buffer first: that must not fall in the window)")
    b.add_argument("--clients", type=int, default=4, help="pgbench clients")
    b.add_argument("--long-idle", type=float, default=40,
                   help="one longer idle window at the sweep interval (0: none)")
    b.add_argument("--no-oc-pgbench", action=argparse.BooleanOptionalAction, default=True,
                   help="also pgbench with output commit off at each interval (default on)")
    b.add_argument("--idle-only", action="store_true",
                   help="only the idle controls at each interval: rdb-dirty at rate 0 "
                        "in 1 ms steps, and in one sleep (--one-sleep), for the floor")
    b.add_argument("--out", default=None, help="output stem (default docs/bench/dirty)")
    return b


def qga_path():
    return vm.vm_files("primary", VM_NAME)["qga"]


def expected_pages(rate_mb, seconds_per_epoch, buffer_mb):
    pages = rate_mb * (1 << 20) * seconds_per_epoch / PAGE
    return min(pages, buffer_mb * (1 << 20) / PAGE)


def census_summary(census, epochs):
    """Per block, per epoch, from the daemon's dirty_census."""
    out = []
    for b in (census or {}).get("blocks", []):
        n = max(epochs, 1)
        out.append({"block": b["name"], "pages_per_epoch": b["pages"] / n,
                    "zero_pages_per_epoch": b["zero_pages"] / n,
                    "distinct": b["distinct"], "hot": b["hot"], "top": b["top"]})
    return out


def guest_time_ns():
    with closing(guest_agent.GuestAgent(qga_path())) as ga:
        return ga.command("guest-get-time")


def window_stats(interval, window_s):
    """reset-stats, one quiet window, the primary's numbers for it. The
    guest's clock is read just before and after (outside the window): it
    stops while QEMU is stopped for a checkpoint, so the guest runs only
    that share of the window, and rdb-dirty's rate is in guest time. The
    window's length runs from the reset to the status read after it."""
    clock = {}

    def read_clocks():
        clock["h0"] = time.monotonic()
        clock["g0"] = guest_time_ns()

    def quiet_window():
        t0 = time.monotonic()
        time.sleep(window_s)
        return t0

    t0, p = harness.measured_window(VM_NAME, read_clocks, quiet_window)
    elapsed = time.monotonic() - t0
    # status carries the census's counts only; the hot and most shipped
    # pages scan every guest page, so they have a command of their own
    census = protection.request("primary", "dirty-census", vm=VM_NAME)["dirty_census"]
    h0, g0 = clock["h0"], clock["g0"]
    g1 = guest_time_ns()
    host_span = time.monotonic() - h0
    if not p or p.get("state") != "protected":
        raise SystemExit(f"protection at {interval} ms broke: {(p or {}).get('error')}")
    epochs = p["epochs_since_reset"]
    return {
        "window_s": round(elapsed, 2), "epochs": epochs,
        "guest_clock_ratio": (g1 - g0) / 1e9 / host_span,
        "epochs_per_s": epochs / elapsed,
        "epochs_per_s_nominal": 1000 / interval,
        "dirty_pages_per_epoch_mean": p["dirty_pages_per_epoch_mean"],
        "dirty_pages_per_epoch_p50": p.get("dirty_pages_per_epoch_p50"),
        "dirty_pages_per_epoch_p99": p.get("dirty_pages_per_epoch_p99"),
        "pause_ms_p50": p["pause_ms_p50"], "pause_ms_p99": p["pause_ms_p99"],
        "bytes_per_epoch_mean": p["bytes_per_epoch_mean"],
        "backpressure_events": p["backpressure_events"],
        "census": census_summary(census, epochs),
        "census_epochs": census.get("epochs"),
    }


def synthetic_run(args, interval, mode, rate, window_s=None):
    """mode: sparse, dense, idle (rate 0 in 1 ms steps) or idle-sleep
    (rate 0, one sleep)."""
    window_s = window_s or args.seconds
    argv = [RDB_DIRTY, "--buffer-mb", str(args.buffer_mb), "--rate-mb", str(rate),
            "--seconds", str(args.settle + window_s + 2),
            "--mode", "sparse" if mode == "sparse" else "dense"]  # rate 0: either
    if mode == "idle-sleep":
        argv.append("--one-sleep")
    pid = guest_agent.start(qga_path(), argv)
    time.sleep(args.settle)
    run = window_stats(interval, window_s)
    status = guest_agent.finish(qga_path(), pid, timeout=60)
    if status["exitcode"] != 0:
        raise SystemExit(f"rdb-dirty failed in the guest ({status}): {status['err']}")
    report = workload_json(status["out"])
    if report.get("touch_seconds", 0) > args.settle:
        say(f"warning: rdb-dirty took {report['touch_seconds']:.1f} s to touch its buffer, "
            f"more than the {args.settle:g} s settle: the window holds some of it")
    period = 1 / run["epochs_per_s"] if run["epochs_per_s"] else interval / 1000
    guest_period = period * run["guest_clock_ratio"]
    run.update({
        "workload": {"idle": "idle", "idle-sleep": "idle, one sleep"}.get(
            mode, f"{mode} {rate:g} MiB/s"),
        "kind": mode, "rate_mb": rate, "rdb_dirty": report,
        "expected_extra_pages_nominal": expected_pages(rate, interval / 1000, args.buffer_mb),
        "expected_extra_pages": expected_pages(report["rate_mb_achieved"], guest_period,
                                               args.buffer_mb),
        "expected_extra_pages_host_clock": expected_pages(report["rate_mb_achieved"], period,
                                                          args.buffer_mb),
    })
    return run


def workload_json(text):
    lines = [x for x in text.splitlines() if x.startswith("{")]
    if not lines:
        raise SystemExit(f"rdb-dirty printed no JSON: {text!r}")
    return json.loads(lines[-1])


def pgbench_run(args, interval):
    import threading
    total = args.settle + args.seconds + 2
    box = {}
    t = threading.Thread(target=lambda: box.update(
        r=workload.pgbench(vm.DEFAULT_IP, seconds=int(total + 0.999), clients=args.clients)))
    t.start()
    time.sleep(args.settle)
    run = window_stats(interval, args.seconds)
    t.join()
    r = box.get("r") or {}
    if r.get("exit_code") != 0 or r.get("tps") is None:
        raise SystemExit(f"pgbench failed at {interval} ms:\n{r.get('output', '')[-2000:]}")
    run.update({"workload": f"pgbench {args.clients} clients", "kind": "pgbench",
                "tps": r["tps"], "latency_ms": r["latency_ms"],
                "transactions_per_epoch": r["tps"] / run["epochs_per_s"]})
    return run


def show(interval, r):
    extra = ""
    if "expected_extra_pages" in r:
        extra = (f" (expected +{r['expected_extra_pages']:.0f}, achieved "
                 f"{r['rdb_dirty']['rate_mb_achieved']:.1f} MiB/s)")
    say(f"{interval:>3} ms {r['workload']:>20}: {r['dirty_pages_per_epoch_mean']:7.1f} pages/epoch"
        f"{extra}, {r['epochs_per_s']:.1f} epochs/s, pause p50/p99 {r['pause_ms_p50']:.1f}/"
        f"{r['pause_ms_p99']:.1f} ms, {r['bytes_per_epoch_mean'] / 1024:.0f} KiB/epoch, "
        f"backpressure {r['backpressure_events']}")


def clear_backup_and_retry(error):
    """A failed first protect is tried once more, from a backup without
    the VM (harness.clear_backup says why)."""
    say(f"protect failed ({error}); clearing the backup and trying once more")
    harness.clear_backup(VM_NAME)


@contextmanager
def protected(interval, output_commit=True, options=None):
    """The VM protected for the with-block (harness.protected), with a
    second try if the first fails, and a line saying how long it took."""
    started = time.monotonic()
    with harness.protected(VM_NAME, interval,
                           progress=lambda p: say(protection.describe_progress(p)),
                           options=options, output_commit=output_commit,
                           on_failed_try=clear_backup_and_retry):
        say(f"protected at {interval} ms (output commit {'on' if output_commit else 'OFF'}"
            f"{', ' + str(options) if options else ''}) in {time.monotonic() - started:.1f} s")
        yield


def no_oc_pgbench_run(args, interval):
    """pgbench with output commit off: the clients are no longer paced by
    the epochs, so the guest's work per epoch grows with the interval."""
    with protected(interval, output_commit=False):
        r = pgbench_run(args, interval)
    r.update({"workload": f"pgbench {args.clients} clients, output commit off",
              "kind": "pgbench-no-oc", "interval_ms": interval})
    show(interval, r)
    return r


def interval_runs(args, interval):
    plan = [("idle", 0), ("idle-sleep", 0)] + [(m, r) for m in ("sparse", "dense")
                                              for r in args.rates]
    if args.idle_only:
        plan = [("idle", 0), ("idle-sleep", 0)]
    elif interval == args.sweep_interval:
        plan += [("dense", r) for r in args.sweep_rates]
    runs = []
    with protected(interval):
        for mode, rate in plan:
            runs.append(synthetic_run(args, interval, mode, rate))
            show(interval, runs[-1])
        if not args.idle_only:
            runs.append(pgbench_run(args, interval))
            show(interval, runs[-1])
        if interval == args.sweep_interval and args.long_idle and not args.idle_only:
            r = synthetic_run(args, interval, "idle", 0, window_s=args.long_idle)
            r["workload"] = f"idle, {args.long_idle:g} s window"
            r["kind"] = "idle-long"
            runs.append(r)
            show(interval, r)
    for r in runs:
        r["interval_ms"] = interval
    if args.no_oc_pgbench and not args.idle_only:
        runs.append(no_oc_pgbench_run(args, interval))
    return runs


def guest_iomem():
    """The guest's /proc/iomem as (start, end, name, depth), to name the
    guest-physical ranges the census's most dirtied pages fall in (pc.ram
    offsets are guest-physical addresses below 3 GiB)."""
    s = guest_agent.run(qga_path(), ["/bin/cat", "/proc/iomem"], timeout=30)
    ranges = []
    for line in s["out"].splitlines():
        span, _, name = line.partition(" : ")
        depth = (len(span) - len(span.lstrip())) // 2
        lo, _, hi = span.strip().partition("-")
        try:
            ranges.append((int(lo, 16), int(hi, 16), name.strip(), depth))
        except ValueError:
            continue
    return ranges


def name_address(ranges, addr):
    """The innermost iomem range holding addr, or "?"."""
    best = None
    for lo, hi, name, depth in ranges:
        if lo <= addr <= hi and (best is None or depth > best[1]):
            best = (name, depth)
    return best[0] if best else "?"


# /proc/kpageflags bits (include/uapi/linux/kernel-page-flags.h)
KPF = {0: "locked", 2: "referenced", 3: "uptodate", 4: "dirty", 5: "lru", 6: "active",
       7: "slab", 10: "buddy", 11: "mmap", 12: "anon", 13: "swapcache", 14: "swapbacked",
       15: "compound_head", 16: "compound_tail", 17: "huge", 18: "unevictable",
       20: "nopage", 22: "thp", 23: "offline", 24: "zero_page", 25: "idle", 26: "pgtable"}


def guest_page_flags(pfns):
    """The guest kernel's view of these page frames (/proc/kpageflags):
    what the pages every checkpoint ships are used for."""
    if not pfns:
        return {}
    script = ("for p in " + " ".join(str(p) for p in pfns) + "; do "
              "dd if=/proc/kpageflags bs=8 skip=$p count=1 2>/dev/null | od -An -tu8; done")
    s = guest_agent.run(qga_path(), ["/bin/sh", "-c", script], timeout=60)
    values = [int(x) for x in s["out"].split()]
    out = {}
    for pfn, v in zip(pfns, values):
        names = [name for bit, name in KPF.items() if v >> bit & 1]
        out[hex(pfn * PAGE)] = names or ["(none: kernel-internal, e.g. stack or per-cpu)"]
    return out


def name_top_pages(runs, ranges):
    for r in runs:
        for b in r["census"]:
            if b["block"] == "pc.ram":
                b["top_named"] = [[hex(i * PAGE), n, name_address(ranges, i * PAGE)]
                                  for i, n in b["top"]]


def measured(runs):
    """The intervals that have runs (a failed interval has none)."""
    return sorted({r["interval_ms"] for r in runs})


def floor_of(runs, interval, key="dirty_pages_per_epoch_mean"):
    return next(r[key] for r in runs if r["interval_ms"] == interval and r["kind"] == "idle")


def summarize(runs, args):
    """Measured extra pages over the idle floor against the expected ones;
    the sweep's highest dense rate without backpressure."""
    for r in runs:
        if r["kind"] in ("sparse", "dense"):
            extra = r["dirty_pages_per_epoch_mean"] - floor_of(runs, r["interval_ms"])
            r["measured_extra_pages"] = extra
            # medians: a few idle epochs with bursts of guest activity move the mean
            key = "dirty_pages_per_epoch_p50"
            r["measured_extra_pages_p50"] = r[key] - floor_of(runs, r["interval_ms"], key)
            r["extra_over_expected"] = (extra / r["expected_extra_pages"]
                                        if r["expected_extra_pages"] else None)
    sweep = sorted((r for r in runs if r["interval_ms"] == args.sweep_interval
                    and r["kind"] == "dense"), key=lambda r: r["rate_mb"])
    sustained = [r for r in sweep if r["backpressure_events"] == 0
                 and r["epochs_per_s"] >= 0.8 * r["epochs_per_s_nominal_idle"]]
    best = sustained[-1] if sustained else None
    return {
        "rule": "no backpressure events and epochs/s at least 80% of the idle run's "
                "at the same interval",
        "interval_ms": args.sweep_interval,
        "sweep": [{"rate_mb": r["rate_mb"], "rate_mb_achieved": r["rdb_dirty"]["rate_mb_achieved"],
                   "epochs_per_s": r["epochs_per_s"], "backpressure_events":
                   r["backpressure_events"], "pause_ms_p99": r["pause_ms_p99"],
                   "bytes_per_epoch_mean": r["bytes_per_epoch_mean"]} for r in sweep],
        "highest_sustained_rate_mb": best["rate_mb"] if best else None,
        "highest_sustained_rate_mb_achieved": best["rdb_dirty"]["rate_mb_achieved"] if best else None,
        "pause_ms_p99_at_it": best["pause_ms_p99"] if best else None,
    }


def fresh_vm_with_rdb_dirty():
    """Boots the bench VM fresh and checks rdb-dirty runs in it; returns
    the accelerator it runs on."""
    accel = fresh_vm_for_protection(VM_NAME)
    check = guest_agent.run(qga_path(), [RDB_DIRTY, "--rate-mb", "0", "--seconds", "0",
                                         "--buffer-mb", "1"], timeout=30)
    if check["exitcode"] != 0:
        raise SystemExit(f"rdb-dirty does not run in the guest: {check}")
    return accel


def run(args, out_dir):
    accel = fresh_vm_with_rdb_dirty()
    iomem = guest_iomem()
    runs, failures = [], []
    try:
        for ms in args.intervals:
            try:
                runs += interval_runs(args, ms)
            except (protection.ProtectionError, guest_agent.GuestAgentError, SystemExit) as e:
                say(f"interval {ms} ms failed: {e}")
                failures.append({"interval_ms": ms, "error": str(e)})
        hot = sorted({i for r in runs if r["kind"] in ("idle", "idle-sleep") for b in r["census"]
                      if b["block"] == "pc.ram" for i, _ in b["top"]})
        try:
            flags = guest_page_flags(hot)
        except (guest_agent.GuestAgentError, ValueError) as e:
            flags = {"error": str(e)}
    finally:
        stop_vm_everywhere(VM_NAME)
    for r in runs:
        idle = [x for x in runs if x["interval_ms"] == r["interval_ms"] and x["kind"] == "idle"]
        r["epochs_per_s_nominal_idle"] = idle[0]["epochs_per_s"] if idle else r["epochs_per_s"]
    result = {
        **result_head("dirty", accel),
        "settings": {"intervals_ms": args.intervals, "rates_mb": args.rates,
                     "sweep_interval_ms": args.sweep_interval,
                     "sweep_rates_mb": args.sweep_rates, "buffer_mb": args.buffer_mb,
                     "window_s": args.seconds, "settle_s": args.settle,
                     "long_idle_s": args.long_idle, "pgbench_clients": args.clients},
        "qemu": str(paths.qemu_binary().resolve()),
        "lan": netns.HOSTS["backup"][1],
        "runs": runs,
        "failed_intervals": failures,
        "guest_iomem": [[hex(lo), hex(hi), name] for lo, hi, name, depth in iomem
                        if depth <= 1],
    }
    name_top_pages(runs, iomem)
    result["idle_top_page_flags"] = flags
    result["max_dense_rate"] = summarize(runs, args)
    result["idle_floor_pages_per_epoch"] = {ms: floor_of(runs, ms) for ms in measured(runs)}
    stem = args.out or str(out_dir / "dirty")
    workload.save_json(stem + ".json", result)
    plot(result, stem + ".png")
    m = result["max_dense_rate"]
    say(f"highest sustained dense rate at {m['interval_ms']} ms: "
        f"{m['highest_sustained_rate_mb']} MiB/s (pause p99 {m['pause_ms_p99_at_it']} ms)")
    say(f"wrote {stem}.json and {stem}.png")
    return result


def plot(result, path):
    plt = pyplot()
    runs = result["runs"]
    ivs = measured(runs)
    fig, (ax1, ax2, ax3, ax4) = plt.subplots(1, 4, figsize=(21, 5))
    names = []
    for r in runs:
        if r["workload"] not in names and all(
                any(x["workload"] == r["workload"] and x["interval_ms"] == ms for x in runs)
                for ms in ivs):
            names.append(r["workload"])
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, name in enumerate(names):
        color = colors[i % len(colors)]
        pts = sorted(((x["interval_ms"], x) for x in runs if x["workload"] == name),
                     key=lambda t: t[0])
        ax1.plot([ms for ms, _ in pts], [x["dirty_pages_per_epoch_mean"] for _, x in pts],
                 marker="o", color=color, label=name)
        if "expected_extra_pages" in pts[0][1] and pts[0][1]["rate_mb"] > 0:
            ax1.plot([ms for ms, _ in pts],
                     [floor_of(runs, ms) + x["expected_extra_pages"] for ms, x in pts],
                     linestyle="--", color=color, alpha=0.6)
    ax1.set_xscale("log")
    ax1.set_yscale("log")
    ax1.set_xticks(ivs, [str(ms) for ms in ivs])
    ax1.set_xlabel("checkpoint interval (ms)")
    ax1.set_ylabel("dirty pages per epoch (mean)")
    ax1.set_title("measured (solid); idle floor + rate x period / 4 KiB (dashed)", fontsize=9)
    ax1.legend(fontsize=7)
    syn = [r for r in runs if r.get("measured_extra_pages") is not None]
    for kind, marker in (("sparse", "s"), ("dense", "o")):
        xs = [r["expected_extra_pages"] for r in syn if r["kind"] == kind]
        ys = [max(r["measured_extra_pages"], 1) for r in syn if r["kind"] == kind]
        ax2.scatter(xs, ys, marker=marker, label=kind)
    if syn:
        lim = [1, max(max(r["expected_extra_pages"] for r in syn),
                      max(r["measured_extra_pages"] for r in syn)) * 1.5]
        ax2.plot(lim, lim, color="grey", linestyle=":", label="measured = expected")
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel("expected extra pages per epoch (rdb-dirty)")
    ax2.set_ylabel("measured pages per epoch minus idle")
    ax2.set_title("tracking check", fontsize=9)
    ax2.legend(fontsize=7)
    sweep = result["max_dense_rate"]["sweep"]
    if sweep:
        xs = [s["rate_mb_achieved"] for s in sweep]
        ax3.plot(xs, [s["pause_ms_p99"] for s in sweep], marker="o", label="pause p99 (ms)")
        ax3.plot(xs, [s["epochs_per_s"] for s in sweep], marker="s", label="epochs/s")
        ax3.plot(xs, [s["bytes_per_epoch_mean"] / (1 << 20) for s in sweep], marker="^",
                 label="MiB per epoch")
        for s, x in zip(sweep, xs):
            if s["backpressure_events"]:
                ax3.annotate(f"bp {s['backpressure_events']}", (x, s["epochs_per_s"]),
                             fontsize=7)
    ax3.set_xlabel(f"dense rate achieved in the guest (MiB/s), "
                   f"{result['max_dense_rate']['interval_ms']} ms interval")
    ax3.set_title("dense sweep", fontsize=9)
    ax3.legend(fontsize=7)
    for kind, color in (("pgbench", "#7f7f7f"), ("pgbench-no-oc", "#bcbd22")):
        pts = sorted((r for r in runs if r["kind"] == kind), key=lambda r: r["interval_ms"])
        if not pts:
            continue
        label = "output commit on" if kind == "pgbench" else "output commit off"
        ax4.plot([r["interval_ms"] for r in pts], [r["dirty_pages_per_epoch_mean"] for r in pts],
                 marker="o", color=color, label=f"pages/epoch, {label}")
        ax4.plot([r["interval_ms"] for r in pts],
                 [100 * r["transactions_per_epoch"] for r in pts], marker="s",
                 linestyle="--", color=color, label=f"100 x transactions/epoch, {label}")
    ax4.plot(ivs, [floor_of(runs, ms) for ms in ivs], marker="o", color="#1f77b4",
             label="pages/epoch, idle")
    ax4.set_xscale("log")
    ax4.set_yscale("log")
    ax4.set_xticks(ivs, [str(ms) for ms in ivs])
    ax4.set_xlabel("checkpoint interval (ms)")
    ax4.set_title("pgbench: work per epoch vs pages per epoch", fontsize=9)
    ax4.legend(fontsize=7)
    fig.suptitle(f"Dirty pages per checkpoint: rdb-dirty, idle and pgbench "
                 f"({result['accel']}, {result['settings']['window_s']:g} s windows)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
