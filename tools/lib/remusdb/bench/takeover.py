"""remusdb-bench takeover: the backup's ways of restoring the committed
image at failover, side by side in one run, at one or more guest sizes.

Eager, the backup writes every page of the committed image into QEMU's
`-incoming` before the VM may run, so takeover grows with the RAM the
guest uses. Lazy, the backup's QEMU gets the device state and runs at
once, and the image is served by the fork's postcopy source (issue 11).
Shared (the default since issue 22), the backup's QEMU maps the image's
main RAM where the backup keeps it, and only the small blocks and the
device state are streamed. Each round runs the failover drill (power cut
under pgbench and the commit ledger, detection by heartbeats) once per
mode and size, rotating which mode goes first, and keeps what the drill
measured: takeover (primary last heard -> VM running on the backup), its
restore step and the bytes it streamed, the client-visible downtime,
lost acknowledged commits (must be 0) and, lazy, when every page was out.
--fill-percent makes the guest write that share of its RAM (tmpfs) before
protection, so that the RAM in use grows with the size. A drill that
broke off is kept as a failed run.
"""
import statistics
from functools import partial

from ..drill import failover
from ..lab import workload
from .. import output
from .harness import csv_ints, result_head
from .plot import pyplot

VM_NAME = "tko"
say = partial(output.say, "bench takeover")


def add_parser(sub):
    b = sub.add_parser("takeover", help="failover drills restoring shared, eager or lazy, "
                       "side by side")
    b.add_argument("--rounds", type=int, default=2, help="drills per mode and size (default 2)")
    b.add_argument("--modes", default="eager,lazy",
                   help="comma-separated restore modes: shared, eager, lazy (default eager,lazy)")
    b.add_argument("--sizes", default="1024",
                   help="comma-separated guest RAM sizes in MiB (default 1024)")
    b.add_argument("--fill-percent", type=int, default=0,
                   help="share of its RAM the guest fills before protection (default 0)")
    b.add_argument("--out", default=None, help="output stem (default docs/bench/takeover)")
    return b


def one(mode, index, mem_mb=1024, fill_mb=0):
    opts = failover.DrillOptions(vm_name=VM_NAME, restore=mode, index=index, mem_mb=mem_mb,
                                 fill_mb=fill_mb)
    r = failover.run(opts)
    fo = r.get("failover") or {}
    run = {"restore": mode, "mem_mb": mem_mb, "fill_mb": fill_mb, "passed": r.get("passed"),
           "verdict": r.get("verdict"), "failed_reason": r.get("failed_reason"),
           "restored_as": fo.get("restore"), "not_shared": fo.get("not_shared"),
           "takeover_ms": r.get("takeover_ms"), "restore_ms": fo.get("restore_ms"),
           "stream_bytes": fo.get("stream_bytes"),
           "downtime_ms": r.get("downtime_ms"),
           "acked_commits": r.get("acked_commits"),
           "lost_acked_commits": r.get("lost_acked_commits"),
           "lazy": fo.get("lazy"), "workdir": r.get("workdir")}
    # A run restored some other way than asked (e.g. shared fell back) measured the wrong thing.
    if run["passed"] and mode != "lazy" and run["restored_as"] != mode:
        run["passed"] = False
        run["failed_reason"] = (f"asked to restore {mode}, the backup restored "
                                f"{run['restored_as']} ({run['not_shared']})")
    say(f"{mode} at {mem_mb} MiB: takeover {run['takeover_ms']} ms (restore "
        f"{run['restore_ms']} ms, {run['stream_bytes']} bytes streamed), client-visible "
        f"downtime {run['downtime_ms']} ms, lost {run['lost_acked_commits']} of "
        f"{run['acked_commits']}: {run['verdict'] or run['failed_reason']}")
    return run


def summary(runs, mode, mem_mb=None):
    ok = [r for r in runs if r["restore"] == mode and r["passed"]
          and (mem_mb is None or r["mem_mb"] == mem_mb)]

    def med(key):
        vals = [r[key] for r in ok if r.get(key) is not None]
        return statistics.median(vals) if vals else None
    return {"runs": sum(r["restore"] == mode and (mem_mb is None or r["mem_mb"] == mem_mb)
                        for r in runs), "passed": len(ok),
            "takeover_ms_median": med("takeover_ms"), "restore_ms_median": med("restore_ms"),
            "stream_bytes_median": med("stream_bytes"),
            "downtime_ms_median": med("downtime_ms")}


def run(args, out_dir):
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    sizes = csv_ints(args.sizes)
    bad = [m for m in modes if m not in ("shared", "eager", "lazy")]
    if bad or not modes or not sizes:
        raise SystemExit(f"bench takeover: modes must be shared, eager or lazy (not {bad}), "
                         f"and at least one size")
    runs = []
    for i in range(args.rounds):
        for mem_mb in sizes:
            fill_mb = mem_mb * args.fill_percent // 100
            order = modes[i % len(modes):] + modes[:i % len(modes)]
            for mode in order:
                runs.append(one(mode, len(runs) + 1, mem_mb, fill_mb))
    result = {**result_head("takeover", "tcg"), "runs": runs, "modes": modes, "sizes_mb": sizes,
              "fill_percent": args.fill_percent}
    for mode in modes:
        result[mode] = summary(runs, mode)
        result[mode]["by_size"] = {str(m): summary(runs, mode, m) for m in sizes}
    e, z = result.get("eager"), result.get("lazy")
    if e and z and e["takeover_ms_median"] and z["takeover_ms_median"]:
        result["takeover_ratio_lazy_to_eager"] = z["takeover_ms_median"] / e["takeover_ms_median"]
    sh = result.get("shared")
    if e and sh:
        result["takeover_ratio_shared_to_eager_by_size"] = {
            str(m): (sh["by_size"][str(m)]["takeover_ms_median"] /
                     e["by_size"][str(m)]["takeover_ms_median"])
            if sh["by_size"][str(m)]["takeover_ms_median"] and
            e["by_size"][str(m)]["takeover_ms_median"] else None for m in sizes}
    stem = args.out or str(out_dir / "takeover")
    workload.save_json(stem + ".json", result)
    plot(result, stem + ".png")
    for mode in modes:
        say(f"{mode}: {result[mode]}")
    say(f"wrote {stem}.json and {stem}.png")
    return result


COLORS = {"eager": "#d62728", "lazy": "#1f77b4", "shared": "#2ca02c"}


def plot(result, path):
    plt = pyplot()
    modes = result.get("modes") or ["eager", "lazy"]
    sizes = result.get("sizes_mb") or [1024]
    fig, ax = plt.subplots(figsize=(8, 4))
    keys = (("takeover_ms", "takeover"), ("restore_ms", "restore step"),
            ("downtime_ms", "client-visible downtime"))
    width = len(modes) * len(sizes) + 1
    for x, (mode, mem_mb) in enumerate((m, s) for m in modes for s in sizes):
        for k, (key, _) in enumerate(keys):
            vals = [r[key] for r in result["runs"]
                    if r["restore"] == mode and r.get("mem_mb", 1024) == mem_mb
                    and r["passed"] and r.get(key) is not None]
            xs = [k * width + x + 0.1 * j for j in range(len(vals))]
            marker = "o" if sizes.index(mem_mb) == 0 else "s"
            ax.plot(xs, vals, marker, color=COLORS[mode],
                    label=f"{mode}, {mem_mb} MiB" if k == 0 else None)
    ax.set_xticks([k * width + (width - 2) / 2 for k in range(len(keys))])
    ax.set_xticklabels([label for _, label in keys])
    ax.set_ylabel("ms")
    ax.legend(fontsize="small")
    fill = result.get("fill_percent")
    ax.set_title(f"failover drill (power cut), restore {' vs '.join(modes)}, TCG guest"
                 + (f", {fill}% of RAM filled" if fill else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
